# Installs npullm from NPULLM_BUILD_DIR into a temporary prefix, then configures, builds and
# runs the project in CONSUMER_SOURCE_DIR against it with find_package(npullm CONFIG REQUIRED):
# a header-only program, the pipelines of main.cpp with npullm::kernels, and a GGUF decode
# program (gguf_decode.cpp, run on GGUF) built for each -march of MARCHES. Each of the
# latter must take its kernels from npullm::kernels: its object refers to the quantized linear's
# run_quant_linear and to flash attention's driver without defining any kernel (nm), and it runs.
foreach(var NPULLM_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR GGUF MARCHES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: ${var} is not set")
  endif()
endforeach()
set(marches_commas "${MARCHES}")  # one argument for the consumer's configure
string(REPLACE "," ";" MARCHES "${MARCHES}")

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: '${ARGN}' failed (${rc}):\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${NPULLM_BUILD_DIR} --prefix ${prefix})
foreach(f npullmConfig.cmake npullmConfigVersion.cmake npullmTargets.cmake)
  file(GLOB_RECURSE found ${prefix}/*/${f})
  if(NOT found)
    message(FATAL_ERROR "consumer test: ${f} was not installed under ${prefix}")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCONSUMER_MARCHES=${marches_commas})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/npullm_header_only)
run(${WORK_DIR}/build/npullm_consumer)

find_program(NM nm REQUIRED)
foreach(march IN LISTS MARCHES)
  string(MAKE_C_IDENTIFIER ${march} id)
  set(object ${WORK_DIR}/build/CMakeFiles/npullm_gguf_decode_${id}.dir/gguf_decode.cpp.o)
  if(NOT EXISTS ${object})
    message(FATAL_ERROR "consumer test: no object of npullm_gguf_decode_${id}")
  endif()
  execute_process(COMMAND ${NM} -C --undefined-only ${object} OUTPUT_VARIABLE undefined)
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE defined)
  set(kernels "detail::(run_quant_linear|run_tiles|key_scores|value_products|flash_tiles)<")
  if(NOT undefined MATCHES "detail::run_quant_linear<" OR NOT undefined MATCHES
     "detail::flash_tiles<" OR defined MATCHES "${kernels}")
    message(FATAL_ERROR "consumer test: -march=${march}: the object compiled kernels itself "
                        "instead of taking npullm::kernels' (quantized linear, flash attention)")
  endif()
  run(${WORK_DIR}/build/npullm_gguf_decode_${id} ${GGUF} 8)
  if(NOT run_output MATCHES "8 tokens decoded")
    message(FATAL_ERROR "consumer test: -march=${march}: ${run_output}")
  endif()
  message(STATUS "consumer: -march=${march}: ${run_output}")
endforeach()
