# npullm_server against the official OpenAI client (cmake -P): node --test on client.test.mjs
# with the server and the model of npullm_run_cli (a tiny Llama with Phi-3's vocabulary, made
# from ../shared/vocab). Skipped, saying why, without that vocabulary, without node, or without
# the pinned client (scripts/install-deps.sh installs it with npm ci).
#   -DSERVER=<npullm_server> -DMODEL=<model.gguf> -DVOCAB=<the vocabulary GGUF> -DDIR=<tests/serve>
#   -DSLOW=<factor for the waits: 1, or more under the sanitizers>
cmake_minimum_required(VERSION 3.21)
if(NOT EXISTS "${VOCAB}")
  message("npullm-skipped: npullm_server_client: ${VOCAB} is absent (../shared/vocab beside the "
          "checkout): the server was not run")
  return()
endif()
find_program(NODE node)
if(NOT NODE)
  message("npullm-skipped: npullm_server_client: no node (scripts/install-deps.sh installs it)")
  return()
endif()
if(NOT EXISTS "${DIR}/node_modules/openai/package.json")
  message("npullm-skipped: npullm_server_client: the openai client is not installed in "
          "${DIR}/node_modules (scripts/install-deps.sh runs npm ci there)")
  return()
endif()
set(ENV{NPULLM_SERVER} "${SERVER}")
set(ENV{NPULLM_MODEL} "${MODEL}")
set(ENV{NPULLM_SLOW} "${SLOW}")
execute_process(COMMAND ${NODE} --test --test-reporter=spec ${DIR}/client.test.mjs
                WORKING_DIRECTORY ${DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "npullm_server_client: node --test exited with ${rc}")
endif()
