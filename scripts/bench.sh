#!/usr/bin/env bash
# `make bench [QUICK=1] [ISA=native|avx2|x86-64]`: builds the benchmarks in Release for the ISA,
# measures the machine's limits once with code of that ISA, runs every bench_* binary against
# them with a progress line, and writes into build/bench/ (build/bench-<ISA> for avx2, x86-64):
#   json/limits.json, json/<binary>.json   raw Google Benchmark JSON
#   report.md                              machine, limits, summary, a table per primitive
#   *.png, plots/*.dat, plots/*.gp         plots (rendered by gnuplot) and their data
#   log/<binary>.txt                       each binary's console output
# QUICK=1 runs a representative subset of every binary (a few minutes on 2 cores); the full
# suite runs every benchmark. A binary this script has no quick subset for runs, in quick mode,
# the first benchmark of each of its primitives at the largest thread count.
#
# Environment: QUICK (0/1), ISA (native, avx2 or x86-64: the NPULLM_ISA the benchmarks and the
# limits are built for, default native), BENCH_BUILD_DIR (default build/release for native, else
# build/release-<ISA>: the presets release, release-avx2, release-x86-64), BENCH_OUT (default
# build/bench for native, else build/bench-<ISA>), JOBS (build parallelism, default nproc).
# `make bench ISA=avx2` measures the AVX2 build (AVX2 FMA peak, AVX2 kernels) on any machine
# that runs AVX2, an AVX-512 one included.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
case "${QUICK:-0}" in
  0 | "" | no | false) quick=0 ;;
  *) quick=1 ;;
esac
isa=${ISA:-native}
case "$isa" in
  native) preset=release; suffix= ;;
  avx2 | x86-64) preset=release-$isa; suffix=-$isa ;;
  *) echo "bench: ISA=$isa: must be native, avx2 or x86-64" >&2; exit 1 ;;
esac
build=${BENCH_BUILD_DIR:-build/release$suffix}
out=${BENCH_OUT:-build/bench$suffix}
jobs=${JOBS:-$(nproc)}
start_s=$(date +%s)

die() {
  echo "bench: $*" >&2
  exit 1
}
elapsed() {
  local s=$(($(date +%s) - start_s))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# ---- quick subsets: --benchmark_filter per binary; @ALL@ is its largest thread count --------
declare -A quick_filter=(
  [bench_core]='^convert/'
  [bench_kv]='/blocks10000/|^kv_metadata/'
  [bench_attention]='^attention_decode/h14x2/d64/kv[0-9]+/f16/(contiguous|block16)/cold/threads:@ALL@(/|$)|^attention_decode/h14x2/d64/kv4096/f16/contiguous/hot/threads:@ALL@(/|$)|^attention_prefill/h14x2/d64/causal512x512/threads:@ALL@$'
  [bench_pyramid]='^pyramid_decode/.*/threads:@ALL@$|^pyramid_prefill/c4096/.*/threads:@ALL@$'
  [bench_ops]='^linear/m1/k896/n4864/[a-z0-9]+/cold/threads:@ALL@$|^linear/m(1|8|32|512)/k896/n4864/(f32|bf16)/threads:@ALL@$|^linear/m1/k896/n151936/bf16/threads:@ALL@$'
  [bench_pipeline]='^pipeline_(prefill|decode)/qwen2-0.5b/bf16/[a-z0-9]+/threads:@ALL@(/|$)'
  [bench_batch]='^batch_(unroll|scorer)/qwen2-0.5b/bf16/n8/l128/threads:@ALL@(/|$)'
  [bench_generate]='^generate/qwen2-0.5b/bf16/batch(1|4|16)/threads:@ALL@(/|$)'
  [bench_speculative]='^speculative/qwen2-0.5b/bf16/k4/agree80/threads:@ALL@(/|$)'
  [bench_window]='^pipeline_decode/mistral-40m/ctx8192/[a-z0-9]+/contiguous/threads:@ALL@(/|$)'
)
# The order binaries run in (the rest follow, by name): cheap and fundamental first.
order=(bench_core bench_kv bench_attention bench_pyramid bench_ops bench_pipeline bench_batch
       bench_generate)

# ---- build ---------------------------------------------------------------------------------
echo "bench: building the benchmarks in Release for ISA $isa ($build, $jobs jobs)"
mkdir -p "$out"
if [ "$build" = "build/release$suffix" ]; then
  cmake --preset "$preset" > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; die "configure failed"; }
elif [ -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNPULLM_ISA="$isa" > "$out/configure.log" 2>&1 ||
    { cat "$out/configure.log"; die "configure failed"; }
else
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNPULLM_ISA="$isa" \
    > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; die "configure failed"; }
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
[ "$build_type" = Release ] || die "$build is configured as '$build_type', not Release"
build_isa=$(sed -n 's/^NPULLM_ISA:[A-Z]*=//p' "$build/CMakeCache.txt")
[ "$build_isa" = "$isa" ] || die "$build is configured for NPULLM_ISA '$build_isa', not '$isa'"
mapfile -t targets < <(cmake --build "$build" --target help 2>/dev/null |
  sed -nE 's/^(\.\.\. )?(bench_[A-Za-z0-9_]+)(:.*)?$/\2/p' | sort -u)
[ ${#targets[@]} -gt 0 ] || die "no bench_* targets in $build (NPULLM_BUILD_BENCHMARKS off?)"
failed=()
declare -A broken=()
if ! cmake --build "$build" -j "$jobs" --target npullm_bench_report "${targets[@]}" \
    > "$out/build.log" 2>&1; then
  # One benchmark that does not build should not cost the others their report: build them one
  # by one and leave out (and report) the ones that fail.
  cmake --build "$build" -j "$jobs" --target npullm_bench_report >> "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; die "the report generator does not build (log: $out/build.log)"; }
  for t in "${targets[@]}"; do
    if ! cmake --build "$build" -j "$jobs" --target "$t" > "$out/build-$t.log" 2>&1; then
      grep -m 5 -E 'error|Error' "$out/build-$t.log" | sed 's/^/  /'
      echo "bench: $t does not build: left out (log: $out/build-$t.log)"
      failed+=("$t (build)")
      broken[$t]=1
    fi
  done
fi

# Every bench_* binary built, in run order.
binaries=()
for b in "${order[@]}"; do
  [[ " ${targets[*]} " == *" $b "* ]] && [ -z "${broken[$b]:-}" ] && binaries+=("$b")
done
for t in "${targets[@]}"; do
  [[ " ${order[*]} " == *" $t "* ]] && continue
  [ -z "${broken[$t]:-}" ] && [ -x "$build/benchmarks/$t" ] && binaries+=("$t")
done

# ---- this run's output directory and context -----------------------------------------------
rm -rf "$out/json" "$out/log" "$out/plots" "$out/report.md" "$out"/*.png
mkdir -p "$out/json" "$out/log"
clean() { tr -d ',\n' | sed 's/  */ /g; s/^ //; s/ $//'; }
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1 | clean)
memory=$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
compiler=$("${cxx:-c++}" --version 2>/dev/null | head -1 | clean)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- include benchmarks 2>/dev/null; then
  commit="$commit (with local changes)"
fi
context="npullm_mode=$([ $quick = 1 ] && echo quick || echo full),npullm_commit=$commit"
[ -n "$cpu_model" ] && context+=",cpu_model=$cpu_model"
[ -n "$memory" ] && context+=",memory=$memory"
[ -n "$compiler" ] && context+=",compiler=$compiler"
common=(--benchmark_color=false --benchmark_out_format=json)
[ $quick = 1 ] && common+=(--benchmark_min_time=0.1)

# Other processes competing for the CPUs or memory make every figure low and noisy: the share of
# CPU time others use while this script waits half a second (before the limits and before each
# binary) goes into the JSON context, and report.md shows it.
other_cpu_pct() {
  local a b
  a=($(head -1 /proc/stat 2> /dev/null)) || { echo 0; return; }
  sleep 0.5
  b=($(head -1 /proc/stat 2> /dev/null)) || { echo 0; return; }
  # cpu user nice system idle iowait irq softirq steal
  local busy=$(( (b[1] + b[2] + b[3] + b[6] + b[7] + b[8]) - (a[1] + a[2] + a[3] + a[6] + a[7] + a[8]) ))
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) ))
  [ $((busy + idle)) -gt 0 ] && echo $(( 100 * busy / (busy + idle) )) || echo 0
}
other=$(other_cpu_pct)
if [ "$other" -gt 10 ]; then
  echo "bench: other processes are using ${other}% of the CPUs: the figures will be low and noisy" \
       "(report.md records it)"
fi

# ---- the machine's limits, once for the whole run --------------------------------------------
limits="$out/json/limits.json"
echo "bench: measuring the machine's limits with $isa code (read bandwidth, fp32 FMA, bf16 dot; per thread count)"
"$build/benchmarks/bench_core" --benchmark_filter='^machine_limits/' "${common[@]}" \
  "--benchmark_context=$context,npullm_other_cpu_pct=$other" --benchmark_out="$limits" > "$out/log/limits.txt" 2>&1 ||
  { cat "$out/log/limits.txt"; die "measuring the limits failed"; }
awk '/^machine_limits\/threads:/ {
  split($1, name, "/"); sub("threads:", "", name[2])
  for (i = 2; i <= NF; ++i) if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]
  printf "  %s thread(s): read %s GB/s, triad %s GB/s, fp32 FMA %s GFLOP/s, bf16 dot %s GFLOP/s\n",
         name[2], v["read_GBps"], v["triad_GBps"], v["fma_GFLOPs"], v["bf16_GFLOPs"] }' \
  "$out/log/limits.txt"
simd=$(sed -n 's/^npullm_isa: //p' "$out/log/limits.txt" | head -1)
echo "  SIMD path of this build: ${simd:-unknown} (NPULLM_ISA=$isa)"
export NPULLM_BENCH_LIMITS="$PWD/$limits"

# ---- what runs -------------------------------------------------------------------------------
regex_escape() { sed 's/[][\.^$*+?(){}|]/\\&/g'; }
declare -A filter_of
total=0
for b in "${binaries[@]}"; do
  bin="$build/benchmarks/$b"
  all=$("$bin" --benchmark_list_tests 2>/dev/null) || die "$b --benchmark_list_tests failed"
  threads=$(grep -o 'threads:[0-9]*' <<< "$all" | cut -d: -f2 | sort -n | tail -1)
  filter=
  if [ $quick = 0 ]; then
    filter=$([ "$b" = bench_core ] && echo '-^machine_limits/' || echo '.')
  elif [ -n "${quick_filter[$b]:-}" ]; then
    filter=${quick_filter[$b]//@ALL@/${threads:-1}}
  fi
  n=0
  if [ -n "$filter" ]; then
    "$bin" --benchmark_list_tests --benchmark_filter="$filter" > "$out/log/$b.list" 2>/dev/null
    n=$(grep -c . "$out/log/$b.list")
  fi
  if [ $quick = 1 ] && [ "$n" -eq 0 ]; then
    # No quick subset known (or it matches nothing any more): the first benchmark of each
    # primitive, at the most threads.
    filter=$(awk -F/ -v t="threads:${threads:-1}" '
        !($1 in seen) && ($0 ~ t "(/|$)" || index($0, "threads:") == 0) { seen[$1] = 1; print }' \
        <<< "$all" | regex_escape | sed 's/^/^/; s/$/$/' | paste -sd'|')
    echo "bench: no quick subset for $b: running the first benchmark of each primitive"
    "$bin" --benchmark_list_tests --benchmark_filter="$filter" > "$out/log/$b.list" 2>/dev/null
    n=$(grep -c . "$out/log/$b.list")
  fi
  [ "$n" -gt 0 ] || continue
  filter_of[$b]=$filter
  total=$((total + n))
done
echo "bench: $total benchmarks from ${#filter_of[@]} binaries ($([ $quick = 1 ] && echo quick || echo full) mode)"

# ---- run, with a progress line -----------------------------------------------------------------
tty=0
[ -t 1 ] && tty=1
width=$( ( [ $tty = 1 ] && tput cols 2> /dev/null) || echo 200)
done_count=0
progress() {  # $1 binary, $2 the benchmark now running
  local msg
  msg=$(printf '[%d/%d] %s %s  (%d left, %s)' $((done_count + 1)) "$total" "$1" "$2" \
        $((total - done_count - 1)) "$(elapsed)")
  if [ $tty = 1 ]; then
    printf '\r\033[K%s' "${msg:0:$((width - 1))}"
  else
    echo "$msg"
  fi
}
for b in "${binaries[@]}"; do
  [ -n "${filter_of[$b]:-}" ] || continue
  mapfile -t names < "$out/log/$b.list"
  declare -A pending=()
  for n in "${names[@]}"; do pending[$n]=1; done
  next=0
  progress "$b" "${names[0]}"
  other=$(other_cpu_pct)
  rc_file="$out/log/$b.rc"
  while IFS= read -r line; do
    name=${line%% *}
    [ -n "$name" ] && [ -n "${pending[$name]:-}" ] || continue
    unset "pending[$name]"
    done_count=$((done_count + 1))
    next=$((next + 1))
    if [[ $line == *"ERROR OCCURRED"* ]]; then
      [ $tty = 1 ] && printf '\n'
      echo "bench: $b: ${line//  / }"
    fi
    [ $next -lt ${#names[@]} ] && progress "$b" "${names[$next]}"
  done < <(stdbuf -oL "$build/benchmarks/$b" --benchmark_filter="${filter_of[$b]}" \
             "${common[@]}" "--benchmark_context=$context,npullm_other_cpu_pct=$other" \
             --benchmark_out="$out/json/$b.json" 2>&1 |
           tee "$out/log/$b.txt"; echo "${PIPESTATUS[0]}" > "$rc_file")
  rc=$(cat "$rc_file" 2> /dev/null || echo 1)
  rm -f "$rc_file"
  if [ "$rc" != 0 ] || [ $next -lt ${#names[@]} ]; then
    [ $tty = 1 ] && printf '\n'
    echo "bench: $b exited with status $rc after $next of ${#names[@]} benchmarks (log: $out/log/$b.txt)"
    failed+=("$b")
    done_count=$((done_count + ${#names[@]} - next))
  fi
  unset pending
done
[ $tty = 1 ] && printf '\r\033[K'
echo "bench: ran $done_count benchmarks ($(elapsed) since the start, build included)"

# ---- report and plots --------------------------------------------------------------------------
jsons=("$limits")
for b in "${binaries[@]}"; do
  [ -s "$out/json/$b.json" ] && jsons+=("$out/json/$b.json")
done
mapfile -t plots < <("$build/benchmarks/report/npullm_bench_report" --out "$out" "${jsons[@]}") ||
  die "the report generator failed"
if command -v gnuplot > /dev/null; then
  for p in "${plots[@]}"; do
    (cd "$out" && gnuplot "plots/$p.gp") || failed+=("gnuplot plots/$p.gp")
  done
else
  echo "bench: gnuplot not found (scripts/install-deps.sh --bench installs it): no PNGs" >&2
fi
echo "bench: $out/report.md"
for p in "${plots[@]}"; do
  [ -f "$out/$p.png" ] && echo "bench: $out/$p.png"
done
echo "bench: done in $(elapsed)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
