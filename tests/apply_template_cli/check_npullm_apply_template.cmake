# npullm_apply_template end to end (cmake -P): a small template and conversation written here
# give exactly the expected text (no newline added) with tools, variables, bos / eos and --date;
# a template's raise_exception is exit code 1 with its message on stderr and nothing on stdout;
# bad flags are refused naming them. With ../shared/vectors/chat-templates: the Qwen3 template
# on a conversation of conversations.json, and the Phi-3 GGUF's own template and BOS
# (../shared/vocab) with -m, byte for byte against Jinja2's renderings.
#   -DTOOL=<npullm_apply_template> -DWORK=<a scratch directory> -DVECTORS=<chat-templates dir>
#   -DVOCAB=<the Phi-3 vocabulary GGUF>
cmake_minimum_required(VERSION 3.21)

function(fail)
  string(JOIN "" msg ${ARGN})
  message(FATAL_ERROR "npullm_apply_template: ${msg}")
endfunction()

# run(<out-var> <rc-var> <args...>): stdout, stderr (<out-var>_err) and the exit code.
function(run var rc_var)
  execute_process(COMMAND ${TOOL} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  set(${var} "${out}" PARENT_SCOPE)
  set(${var}_err "${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/t.jinja
     "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}\n"
     "{% endfor %}{% if tools %}{{ tools | tojson }}\n{% endif %}"
     "{% if add_generation_prompt %}[assistant]{% if not think %} (no thinking){% endif %}"
     "{% endif %}{{ strftime_now('%d/%m/%Y') }}{{ eos_token }}")
file(WRITE ${WORK}/conv.json
     "{\"messages\": [{\"role\": \"user\", \"content\": \" Hi \"}], \"tools\": [{\"name\": \"f\"}],"
     " \"variables\": {\"think\": false}}")
run(out rc -t ${WORK}/t.jinja --messages ${WORK}/conv.json --add-generation-prompt
    --bos "<s>" --eos "</s>" --date "26 Jul 2024")
set(want "<s>[user] Hi\n[{\"name\": \"f\"}]\n[assistant] (no thinking)26/07/2024</s>")
if(NOT rc EQUAL 0 OR NOT out STREQUAL want)
  fail("-t gave (exit ${rc}):\n[${out}]\nwanted:\n[${want}]\n${out_err}")
endif()
run(out rc -t ${WORK}/t.jinja --messages ${WORK}/conv.json --date "26 Jul 2024")
if(NOT rc EQUAL 0 OR NOT out STREQUAL "[user] Hi\n[{\"name\": \"f\"}]\n26/07/2024")
  fail("without --add-generation-prompt / --bos / --eos (exit ${rc}):\n[${out}]")
endif()

# The template's own error: exit 1, its message on stderr, nothing on stdout.
file(WRITE ${WORK}/raise.jinja "x{{ raise_exception('roles must alternate') }}")
run(out rc -t ${WORK}/raise.jinja --messages ${WORK}/conv.json)
if(rc EQUAL 0 OR NOT out STREQUAL "" OR NOT out_err MATCHES "roles must alternate")
  fail("raise_exception: exit ${rc}, stdout [${out}], stderr [${out_err}]")
endif()
# Refusals naming the flag and value.
foreach(bad "--date;yesterday" "--messages;${WORK}/none.json" "-t;${WORK}/none.jinja")
  list(GET bad 0 flag)
  list(GET bad 1 value)
  if(flag STREQUAL "-t")
    run(out rc -t ${value} --messages ${WORK}/conv.json)
  else()
    run(out rc -t ${WORK}/t.jinja --messages ${WORK}/conv.json ${bad})
  endif()
  string(FIND "${out_err}" "error: ${flag} ${value}: " named)
  if(rc EQUAL 0 OR named EQUAL -1)
    fail("'${bad}' was not refused with 'error: ${flag} ${value}: ...' (exit ${rc}):\n${out_err}")
  endif()
endforeach()
run(out rc --messages ${WORK}/conv.json)
if(rc EQUAL 0 OR NOT out_err MATCHES "-t TEMPLATE.jinja or -m FILE.gguf")
  fail("no template was not refused (exit ${rc}):\n${out_err}")
endif()

# ---- the real templates (../shared beside the checkout) ---------------------------------------
if(NOT EXISTS "${VECTORS}/conversations.json" OR NOT EXISTS "${VOCAB}")
  message("npullm-skipped: npullm_apply_template_cli: ${VECTORS} or ${VOCAB} is absent: the "
          "real templates were not rendered (the checks above ran)")
  return()
endif()
# (string(JSON) writes objects with their keys sorted, so no conversation whose tools tojson
# prints, in the caller's key order, is taken from here: test_jinja renders those.)
file(READ ${VECTORS}/conversations.json convs)
foreach(case "qwen3;thinking_off;-t;${VECTORS}/templates/qwen3.jinja"
             "phi3;multi_turn;-m;${VOCAB}")
  list(GET case 0 name)
  list(GET case 1 conv)
  list(GET case 2 flag)
  list(GET case 3 source)
  string(JSON entry GET "${convs}" ${conv})
  file(WRITE ${WORK}/${conv}.json "${entry}")
  set(eos)
  if(flag STREQUAL "-t")
    set(eos --eos "<|im_end|>")
  endif()
  run(out rc ${flag} ${source} --messages ${WORK}/${conv}.json --add-generation-prompt ${eos}
      --date "26 Jul 2024")
  file(READ ${VECTORS}/expected/${name}/${conv}.gen.txt want)
  if(NOT rc EQUAL 0 OR NOT out STREQUAL want)
    fail("${name} on ${conv} (${flag}) differs from Jinja2's (exit ${rc}):\n[${out}]\nwanted:\n"
         "[${want}]\n${out_err}")
  endif()
endforeach()
