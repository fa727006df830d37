# npullm_bench end to end (cmake -P): its json parses and has llama-bench's fields with the values
# the command line asked for, its markdown table has the columns side-by-side.sh reads, and a bad
# command line gives the usage and a nonzero exit status.
#   -DBENCH=<npullm_bench> -DGGUF=<a small GGUF model> -DMODEL_DIR=<a small HF model directory>
cmake_minimum_required(VERSION 3.21)

function(fail)
  string(JOIN "" msg ${ARGN})
  message(FATAL_ERROR "npullm_bench: ${msg}")
endfunction()

# ---- json: a prefill of 8 and a decode of 4, one run each ------------------------------------
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
              n_prompt n_gen avg_ns stddev_ns avg_ts stddev_ts median_ts samples_ns samples_ts)
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
  if(i EQUAL 0 AND NOT (n_prompt EQUAL 8 AND n_gen EQUAL 0))
    fail("test 0 is n_prompt ${n_prompt}, n_gen ${n_gen}; expected pp8 (8, 0)")
  endif()
  if(i EQUAL 1 AND NOT (n_prompt EQUAL 0 AND n_gen EQUAL 4))
    fail("test 1 is n_prompt ${n_prompt}, n_gen ${n_gen}; expected tg4 (0, 4)")
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
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  fail("-o md exited with ${rc}: ${err}")
endif()
string(REGEX MATCHALL "\n\\|[^\n]*" rows "\n${out}")
list(LENGTH rows n)
if(NOT n EQUAL 6)  # header, rule, pp4 and tg2 at 1 and 2 threads
  fail("-t 1,2 -p 4 -n 2 gave ${n} table lines, expected 6:\n${out}")
endif()
list(GET rows 0 header)
foreach(column model size params backend threads test t/s)
  if(NOT header MATCHES "\\| ${column} +\\||\\| +${column} \\|")
    fail("the table has no '${column}' column:\n${out}")
  endif()
endforeach()
foreach(want "CPU +\\| +1 \\| +pp4 \\|" "\\| +2 \\| +tg2 \\| +[0-9.]+ ± [0-9.]+ \\|")
  if(NOT out MATCHES "${want}")
    fail("no row matches '${want}':\n${out}")
  endif()
endforeach()

# ---- a quantized KV cache at a depth ---------------------------------------------------------
# Runs npullm_bench with `flags` (a list) and -o json; the one test's fields must hold the
# values given as key:value pairs after it.
function(expect_json_test flags)
  execute_process(COMMAND ${BENCH} -m ${GGUF} ${flags} -o json
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
    if(NOT v STREQUAL want)
      fail("'${flags}': ${key} is '${v}', expected '${want}':\n${out}")
    endif()
  endforeach()
endfunction()
# q8_0 K and V, 6 tokens of context before each run.
expect_json_test("-p;0;-n;2;-d;6;-r;1;-t;1;-ctk;q8_0;-ctv;q8_0" type_k:q8_0 type_v:q8_0 n_depth:6
                 n_gen:2 n_prompt:0)
# K at 8 bits, V at 4 (kv::mixed<q8_0, q4_0>): each reported as given.
expect_json_test("-p;0;-n;2;-d;3;-r;1;-t;1;-ctk;q8_0;-ctv;q4_0" type_k:q8_0 type_v:q4_0 n_depth:3)
execute_process(COMMAND ${BENCH} -m ${GGUF} -p 2 -n 2 -d 0,3 -r 1 -t 1 --kv q4_0
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
# A model it cannot read: a message naming it, exit status != 0.
execute_process(COMMAND ${BENCH} -m ${GGUF}.missing -p 1 -n 1 -r 1
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "missing")
  fail("a missing model exited with ${rc} and printed: ${err}")
endif()
