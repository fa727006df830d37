# Installs npullm from NPULLM_BUILD_DIR into a temporary prefix, then configures, builds and
# runs the project in CONSUMER_SOURCE_DIR against it with find_package(npullm CONFIG REQUIRED).
foreach(var NPULLM_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: ${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: '${ARGN}' failed (${rc})")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${NPULLM_BUILD_DIR} --prefix ${prefix})
foreach(f npullmConfig.cmake npullmConfigVersion.cmake npullmTargets.cmake)
  file(GLOB_RECURSE found ${prefix}/*/${f})
  if(NOT found)
    message(FATAL_ERROR "consumer test: ${f} was not installed under ${prefix}")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/npullm_consumer)
