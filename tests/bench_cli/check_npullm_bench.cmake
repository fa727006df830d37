# npullm_bench end to end (cmake -P): its json parses and has llama-bench's fields with the values
# the command line asked for, its markdown table has the columns side-by-side.sh reads, the KV
# cache it runs is of the -ctk / -ctv types (kv_bytes, the bytes the pipeline allocated for it,
# are those of the model's K and V in those formats, from MODEL_DIR's config.json), each test's
# figures against the machine are numbers (the limits measured in one process only: every other
# run is --no-limits, to keep this test fast), and a bad command line gives the usage and a
# nonzero exit status, numbers naming their flag and value.
#   -DBENCH=<npullm_bench> -DGGUF=<a small GGUF model> -DMODEL_DIR=<a small HF model directory>
cmake_minimum_required(VERSION 3.21)

function(fail)
  string(JOIN "" msg ${ARGN})
  message(FATAL_ERROR "npullm_bench: ${msg}")
endfunction()

# The KV cache's size from the model's shape (the GGUF is MODEL_DIR quantized): per layer, K
# and V of kv_heads x capacity x head_dim elements; bytes per 32 elements of each format: f32
# 128, f16 / bf16 64, q8_0 34 (32 int8 and an f16 scale), q4_0 18 (32 nibbles and an f16 scale).
file(READ ${MODEL_DIR}/config.json config)
string(JSON layers GET "${config}" num_hidden_layers)
string(JSON kv_heads GET "${config}" num_key_value_heads)
string(JSON head_dim ERROR_VARIABLE no_head_dim GET "${config}" head_dim)
if(no_head_dim)
  string(JSON hidden GET "${config}" hidden_size)
  string(JSON heads GET "${config}" num_attention_heads)
  math(EXPR head_dim "${hidden} / ${heads}")
endif()
set(per32_f32 128)
set(per32_f16 64)
set(per32_bf16 64)
set(per32_q8_0 34)
set(per32_q4_0 18)
# kv_bytes(<var> <capacity in tokens> <K type> <V type>)
function(kv_bytes var capacity k v)
  math(EXPR n "${layers} * ${kv_heads} * ${capacity} * ${head_dim} / 32
               * (${per32_${k}} + ${per32_${v}})")
  set(${var} ${n} PARENT_SCOPE)
endfunction()

# ---- json: a prefill of 8 and a decode of 4, one run each, with the limits --------------------
execute_process(COMMAND ${BENCH} -m ${GGUF} -p 8 -n 4 -r 1 -t 1 -o json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  fail("-o json exited with ${rc}: ${err}")
endif()
string(JSON n ERROR_VARIABLE json_error LENGTH "${out}")
if(json_error)
  fail("-o json output does not parse (${json_error}):\n${out}")
endif()
if(NOT n EQUAL 2)
  fail("-p 8 -n 4 gave ${n} tests, expected 2 (pp8, tg4):\n${out}")
endif()
foreach(i 0 1)
  foreach(key model_filename model_type model_size model_n_params backends n_threads type_k type_v
              n_prompt n_gen avg_ns stddev_ns avg_ts stddev_ts median_ts samples_ns samples_ts
              kv_bytes bytes_per_token weight_bytes_per_token kv_read_bytes_per_token gbps
              read_loop_gbps pct_read_loop flops_per_token gflops peak_kind peak_gflops pct_peak)
    string(JSON v ERROR_VARIABLE e GET "${out}" ${i} ${key})
    if(e)
      fail("test ${i} has no '${key}':\n${out}")
    endif()
    set(${key} "${v}")
  endforeach()
  if(NOT model_filename STREQUAL GGUF)
    fail("model_filename is '${model_filename}', expected '${GGUF}'")
  endif()
  if(NOT backends STREQUAL "CPU" OR NOT n_threads EQUAL 1 OR NOT type_k STREQUAL "f16")
    fail("backends '${backends}', n_threads ${n_threads}, type_k '${type_k}': expected CPU, 1, f16")
  endif()
  if(NOT model_size GREATER 0 OR NOT model_n_params GREATER 0)
    fail("model_size ${model_size}, model_n_params ${model_n_params}: expected > 0")
  endif()
  kv_bytes(want 8 f16 f16)  # room for the longest test, pp8
  if(NOT kv_bytes EQUAL want)
    fail("test ${i}: kv_bytes ${kv_bytes}, expected ${want} (f16 K and V of 8 tokens)")
  endif()
  if(i EQUAL 0 AND NOT (n_prompt EQUAL 8 AND n_gen EQUAL 0))
    fail("test 0 is n_prompt ${n_prompt}, n_gen ${n_gen}; expected pp8 (8, 0)")
  endif()
  if(i EQUAL 1 AND NOT (n_prompt EQUAL 0 AND n_gen EQUAL 4))
    fail("test 1 is n_prompt ${n_prompt}, n_gen ${n_gen}; expected tg4 (0, 4)")
  endif()
  # The figures against the machine: positive numbers (the limits measured: no --no-limits); the
  # bytes a token reads are the weights' and the KV's; K and V read per token: pp8 reads its 8
  # positions once (1 a token), tg4 at contexts 1..4 (2.5 a token), f16 K + V 4 bytes an element.
  foreach(key bytes_per_token weight_bytes_per_token kv_read_bytes_per_token gbps read_loop_gbps
              pct_read_loop flops_per_token gflops peak_gflops pct_peak)
    if(NOT "${${key}}" MATCHES "^[0-9]+(\\.[0-9]+)?$" OR NOT ${key} GREATER 0)
      fail("test ${i}: ${key} is '${${key}}', expected a number > 0:\n${out}")
    endif()
  endforeach()
  if(NOT peak_kind MATCHES "^(int8|bf16|f32)$")
    fail("test ${i}: peak_kind '${peak_kind}', expected int8, bf16 or f32")
  endif()
  math(EXPR kv_pair "${layers} * ${kv_heads} * ${head_dim} * 4")
  if(i EQUAL 0)
    set(kv_want ${kv_pair})
  else()
    math(EXPR kv_want "${kv_pair} * 5 / 2")
  endif()
  if(NOT kv_read_bytes_per_token EQUAL kv_want OR NOT bytes_per_token GREATER
                                                     weight_bytes_per_token)
    fail("test ${i}: kv_read_bytes_per_token ${kv_read_bytes_per_token}, bytes_per_token "
         "${bytes_per_token}; expected ${kv_want}, and more than the weights' "
         "${weight_bytes_per_token}")
  endif()
  string(JSON runs LENGTH "${out}" ${i} samples_ts)
  string(JSON ts0 GET "${out}" ${i} samples_ts 0)
  if(NOT runs EQUAL 1 OR NOT avg_ts GREATER 0 OR NOT median_ts EQUAL ts0)
    fail("test ${i}: ${runs} samples, avg_ts ${avg_ts}, median_ts ${median_ts}, sample ${ts0}; "
         "expected one run whose t/s is the mean and the median")
  endif()
endforeach()

# ---- md on a model directory, two thread counts, two runs -----------------------------------
execute_process(COMMAND ${BENCH} -m ${MODEL_DIR} -p 4 -n 2 -r 2 -t 1,2 --kv bf16 --packing off
                        --no-limits OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  fail("-o md exited with ${rc}: ${err}")
endif()
string(REGEX MATCHALL "\n\\|[^\n]*" rows "\n${out}")
list(LENGTH rows n)
if(NOT n EQUAL 6)  # header, rule, pp4 and tg2 at 1 and 2 threads
  fail("-t 1,2 -p 4 -n 2 gave ${n} table lines, expected 6:\n${out}")
endif()
list(GET rows 0 header)
foreach(column model size params backend threads test t/s MB/tok GB/s "% read" GFLOP/s "% peak")
  if(NOT header MATCHES "\\| ${column} +\\||\\| +${column} \\|")
    fail("the table has no '${column}' column:\n${out}")
  endif()
endforeach()
# After t/s: MB/tok, GB/s, % read, GFLOP/s, % peak (no limits measured: "-").
foreach(want "CPU +\\| +1 \\| +pp4 \\|"
        "\\| +2 \\| +tg2 \\| +[0-9.]+ ± [0-9.]+ \\| +[0-9.]+ \\| +[0-9.]+ \\| +- \\| +[0-9.]+ \\| +- \\|")
  if(NOT out MATCHES "${want}")
    fail("no row matches '${want}':\n${out}")
  endif()
endforeach()

# ---- a quantized KV cache at a depth ---------------------------------------------------------
# Runs npullm_bench with `flags` (a list), -o json and --no-limits; the one test's fields must
# hold the values given as key:value pairs after it (a whole number: that number).
function(expect_json_test flags)
  execute_process(COMMAND ${BENCH} -m ${GGUF} ${flags} -o json --no-limits
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    fail("'${flags}' exited with ${rc}: ${err}")
  endif()
  string(JSON n ERROR_VARIABLE json_error LENGTH "${out}")
  if(json_error OR NOT n EQUAL 1)
    fail("'${flags}' -o json: expected one test:\n${out}")
  endif()
  foreach(pair ${ARGN})
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 key)
    list(GET pair 1 want)
    string(JSON v GET "${out}" 0 ${key})
    if(NOT v STREQUAL want AND NOT (want MATCHES "^[0-9]+$" AND v EQUAL want))  # 0 == 0.0
      fail("'${flags}': ${key} is '${v}', expected '${want}':\n${out}")
    endif()
  endforeach()
endfunction()
# q8_0 K and V, 6 tokens of context before each run: a cache of 8 tokens in q8_0's bytes (17/32
# of f16's), not f16's.
kv_bytes(q8_0 8 q8_0 q8_0)
kv_bytes(f16 8 f16 f16)
if(q8_0 EQUAL f16)
  fail("q8_0 and f16 caches of the same size: the check below would show nothing")
endif()
expect_json_test("-p;0;-n;2;-d;6;-r;1;-t;1;-ctk;q8_0;-ctv;q8_0" type_k:q8_0 type_v:q8_0 n_depth:6
                 n_gen:2 n_prompt:0 kv_bytes:${q8_0})
expect_json_test("-p;0;-n;2;-d;6;-r;1;-t;1" type_k:f16 type_v:f16 kv_bytes:${f16}
                 read_loop_gbps:0 pct_read_loop:0 peak_gflops:0 pct_peak:0)  # --no-limits
# K at 8 bits, V at 4 (kv::mixed<q8_0, q4_0>): each reported as given, the cache of both.
kv_bytes(mixed 5 q8_0 q4_0)
expect_json_test("-p;0;-n;2;-d;3;-r;1;-t;1;-ctk;q8_0;-ctv;q4_0" type_k:q8_0 type_v:q4_0 n_depth:3
                 kv_bytes:${mixed})
kv_bytes(q4_0 5 q4_0 q4_0)
expect_json_test("-p;0;-n;2;-d;3;-r;1;-t;1;--kv;q4_0" type_k:q4_0 type_v:q4_0 kv_bytes:${q4_0})
execute_process(COMMAND ${BENCH} -m ${GGUF} -p 2 -n 2 -d 0,3 -r 1 -t 1 --kv q4_0 --no-limits
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  fail("--kv q4_0 -d 0,3 exited with ${rc}: ${err}")
endif()
foreach(want "\\| +pp2 \\|" "\\| +tg2 \\|" "\\| +pp2 @ d3 \\|" "\\| +tg2 @ d3 \\|")
  if(NOT out MATCHES "${want}")
    fail("--kv q4_0 -d 0,3: no row matches '${want}':\n${out}")
  endif()
endforeach()

# ---- bad command lines: the usage, exit status != 0 -----------------------------------------
# (-ctk q4_0 -ctv q8_0: a K / V pair not compiled into npullm_bench.)
foreach(args "-m;${GGUF};-x;1" "-m;${GGUF};-p;12a" "-m;${GGUF};--kv;q5_1" "-m;${GGUF};-t;0"
        "-m;${GGUF};-o;sql" "-p;8" "-m;${GGUF};-ctk;q4_0;-ctv;q8_0" "-m;${GGUF};-d;x")
  execute_process(COMMAND ${BENCH} ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  if(rc EQUAL 0 OR NOT err MATCHES "usage: npullm_bench")
    fail("'${args}' exited with ${rc} and printed:\n${err}\nexpected the usage and a failure")
  endif()
endforeach()
# Numbers: whole values in their flag's range, the message naming the flag and the value.
foreach(bad "-t;2000" "-t;-1" "-t;0" "-p;1,2x" "-n;-1" "-r;0" "-r;1e3" "-d;4,x" "-p;1000000000")
  execute_process(COMMAND ${BENCH} -m ${GGUF} ${bad} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  list(GET bad 0 flag)
  list(GET bad 1 value)
  string(REGEX REPLACE "^.*," "" item "${value}")  # a list names its bad item
  string(FIND "${err}" "npullm_bench: ${flag} ${item}: " named)
  if(rc EQUAL 0 OR named EQUAL -1 OR NOT err MATCHES "usage: npullm_bench")
    fail("'${bad}' exited with ${rc} and printed:\n${err}\nexpected 'npullm_bench: ${flag} "
         "${item}: ...' and the usage")
  endif()
endforeach()
# A model it cannot read: a message naming it, exit status != 0.
execute_process(COMMAND ${BENCH} -m ${GGUF}.missing -p 1 -n 1 -r 1
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "missing")
  fail("a missing model exited with ${rc} and printed: ${err}")
endif()
