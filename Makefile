# The README's commands. Each installs missing Debian packages first (as root).
JOBS ?= $(shell nproc)
QUICK ?= 0
# make bench ISA=avx2 | ISA=x86-64: the benchmarks built for that instruction set (NPULLM_ISA).
ISA ?= native

.PHONY: test demo bench deps build clean

deps:
	@scripts/install-deps.sh

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

# Every test in a Release build, then again under AddressSanitizer + UndefinedBehaviorSanitizer;
# then what was skipped in each, and why (scripts/test-summary.sh).
test: build
	ctest --preset release -j $(JOBS) --output-junit $(CURDIR)/build/release/ctest-junit.xml
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS) --output-junit $(CURDIR)/build/asan/ctest-junit.xml
	@scripts/test-summary.sh build/release build/asan

demo: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS) --target npullm_demo npullm_rerank
	./build/release/examples/npullm_demo
	./build/release/examples/npullm_rerank

# Every benchmark against the machine's limits measured in the same run: build/bench/report.md,
# plots (PNG, gnuplot) and the raw JSON. QUICK=1: a representative subset (minutes, not an hour).
# ISA=avx2 / ISA=x86-64: built for AVX2 (-march=x86-64-v3) or baseline x86-64 instead of this
# CPU, limits measured with code of that ISA, in build/release-<ISA> and build/bench-<ISA>.
# BENCH_BUILD_DIR (default build/release[-<ISA>]) and BENCH_OUT (default build/bench[-<ISA>])
# move them.
bench:
	@scripts/install-deps.sh --bench
	@QUICK=$(QUICK) JOBS=$(JOBS) ISA=$(ISA) scripts/bench.sh

clean:
	rm -rf build
