# npullm_run end to end (cmake -P) on a GGUF with a real tokenizer: a generated tiny Llama whose
# vocabulary size is Phi-3's, quantized to Q4_0 / Q8_0 by npullm_quantize with the tokenizer.*
# keys of ../shared/vocab/ggml-vocab-phi-3.gguf (random weights: the text means nothing, every
# step is real). Checks: the prompt echoed and the tokens/s lines; the same seed gives the same
# text with every sampling control on; the penalties change greedy text; effects of the
# sampling flags: --top-k 1 at a high temperature is greedy, a high temperature differs from
# greedy and between seeds, --stop cuts greedy text right before the stop string's first
# occurrence, --logit-bias +100 forces its token and -inf bans it; --chat
# renders the file's template (Phi-3's drops system messages), --chat-template-file and
# --chat-template-kwargs reach the interpreter; bad values are refused before the model loads, each naming its flag
# and value; the model's Hugging Face directory runs with --vocab, and without a GGUF vocabulary
# is refused saying what it needs.
#   -DRUN=<npullm_run> -DGGUF=<the model file> -DMODEL_DIR=<its bf16 directory>
#   -DVOCAB=<the vocabulary GGUF>
cmake_minimum_required(VERSION 3.21)

# Without the vocabulary (../shared beside the checkout) nothing here can run: say so, in the
# form ctest reports as skipped (SKIP_REGULAR_EXPRESSION) and make test's summary lists.
if(NOT EXISTS "${VOCAB}")
  message("npullm-skipped: npullm_run_cli: ${VOCAB} is absent (../shared/vocab beside the "
          "checkout): npullm_run was not run")
  return()
endif()

function(fail)
  string(JOIN "" msg ${ARGN})
  message(FATAL_ERROR "npullm_run: ${msg}")
endfunction()

# run(<out-var> <args...>): stdout into <out-var>, stderr into <out-var>_err; exit status 0.
function(run var)
  execute_process(COMMAND ${RUN} -m ${GGUF} -t 1 ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    fail("'${ARGN}' exited with ${rc}:\n${err}")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
  set(${var}_err "${err}" PARENT_SCOPE)
endfunction()

# ---- greedy: the prompt echoed, then text, then the timing lines ------------------------------
run(greedy -p "The capital of France is" -n 24 --temp 0 --min-p 0)
if(NOT greedy MATCHES "^The capital of France is")
  fail("stdout does not start with the prompt:\n${greedy}")
endif()
string(LENGTH "The capital of France is\n" echoed)
string(LENGTH "${greedy}" total)
if(NOT total GREATER echoed)
  fail("no generated text after the prompt:\n${greedy}")
endif()
if(NOT greedy_err MATCHES "prompt: +[0-9]+ tokens" OR NOT greedy_err MATCHES "generation: +24 tokens")
  fail("stderr lacks the prompt / 24-token generation lines:\n${greedy_err}")
endif()

# ---- sampling with every control: the same seed, the same text --------------------------------
set(controls --temp 0.9 --top-k 50 --top-p 0.9 --min-p 0.02 --repeat-penalty 1.3
             --repeat-last-n 16 --frequency-penalty 0.2 --presence-penalty 0.1 --seed 7)
run(a -p "Once upon a time" -n 16 ${controls})
run(b -p "Once upon a time" -n 16 ${controls})
if(NOT a STREQUAL b)
  fail("--seed 7 gave two texts:\n${a}\n---\n${b}")
endif()

# ---- penalties reach the sampler: a huge repetition penalty over the whole context changes
# greedy text (a random model's greedy text repeats its tokens; the penalty forbids that) -------
run(penalized -p "The capital of France is" -n 24 --temp 0 --min-p 0 --repeat-penalty 1e9
    --repeat-last-n -1)
if(penalized STREQUAL greedy)
  fail("--repeat-penalty 1e9 left greedy text unchanged:\n${greedy}")
endif()

# The generated text of a run: stdout without the echoed prompt and the final newline.
function(generated var out prompt)
  string(LENGTH "${prompt}" n)
  string(SUBSTRING "${out}" 0 ${n} head)
  if(NOT head STREQUAL prompt OR NOT out MATCHES "\n$")
    fail("stdout is not the prompt, text and a newline:\n${out}")
  endif()
  string(LENGTH "${out}" total)
  math(EXPR len "${total} - ${n} - 1")
  string(SUBSTRING "${out}" ${n} ${len} text)
  set(${var} "${text}" PARENT_SCOPE)
endfunction()

set(capital "The capital of France is")
generated(greedy_text "${greedy}" "${capital}")

# ---- top-k 1 is greedy whatever the temperature (only one token is left to draw) -------------
run(top1 -p "${capital}" -n 24 --temp 5 --top-k 1 --seed 11)
if(NOT top1 STREQUAL greedy)
  fail("--temp 5 --top-k 1 differs from --temp 0:\n${top1}\n---\n${greedy}")
endif()

# ---- a high temperature over the whole vocabulary: two seeds, two texts, neither greedy's -----
set(hot --temp 5 --top-k 0 --top-p 1 --min-p 0)
run(hot1 -p "${capital}" -n 24 ${hot} --seed 1)
run(hot2 -p "${capital}" -n 24 ${hot} --seed 2)
if(hot1 STREQUAL greedy OR hot2 STREQUAL greedy OR hot1 STREQUAL hot2)
  fail("--temp 5 with seeds 1 and 2 and greedy are not three texts:\n${hot1}\n---\n${hot2}\n"
       "---\n${greedy}")
endif()

# ---- --stop: a word from the second half of greedy text; the same run stops right before the
# word's first occurrence (its text is not printed), saying so on stderr ------------------------
string(LENGTH "${greedy_text}" len)
math(EXPR half "${len} / 2")
string(SUBSTRING "${greedy_text}" ${half} -1 tail)
string(REGEX MATCH " [A-Za-z]+" stop "${tail}")
if(stop STREQUAL "")
  fail("no ASCII word in the second half of greedy text to stop at:\n${greedy_text}")
endif()
string(FIND "${greedy_text}" "${stop}" at)
string(SUBSTRING "${greedy_text}" 0 ${at} before)
run(stopped -p "${capital}" -n 24 --temp 0 --min-p 0 --stop "${stop}" --stop "never in this text")
if(NOT stopped STREQUAL "${capital}${before}\n")
  fail("--stop '${stop}' (first at byte ${at} of greedy text) did not cut the text there:\n"
       "${stopped}\n---\ngreedy:\n${greedy}")
endif()
if(NOT stopped_err MATCHES "stopped at --stop '${stop}'")
  fail("--stop '${stop}': stderr does not say it stopped there:\n${stopped_err}")
endif()

# ---- --logit-bias: +100 on '.' (token 29889 of Phi-3's vocabulary) makes every token '.', even
# sampled, and greedy; -inf on a token bans it (entries for one token add up) ---------------
run(dots -p "${capital}" -n 8 --temp 0.8 --seed 5 --logit-bias 29889+100)
if(NOT dots STREQUAL "${capital}........\n" OR NOT dots_err MATCHES "generation: +8 tokens")
  fail("--logit-bias 29889+100 did not give eight '.':\n${dots}\n${dots_err}")
endif()
run(no_dots -p "${capital}" -n 8 --temp 0 -l 29889+100 -l 29889-inf)
if(no_dots MATCHES "\\.")
  fail("-l 29889-inf after -l 29889+100 still gave '.':\n${no_dots}")
endif()
# The greedy path too.
run(dot_first -p "${capital}" -n 3 --temp 0 -l 29889+100)
if(NOT dot_first STREQUAL "${capital}...\n")
  fail("-l 29889+100 with --temp 0 did not give '...':\n${dot_first}")
endif()

# ---- --chat: the file's template (Phi-3's), rendered by the interpreter: the real template drops
# system messages, so --system leaves the prompt's token count as it is; a template file
# (--chat-template-file) that writes them gives more; --chat-template-kwargs reaches the
# template (its raise_exception is the error, exit 1) ----------------------------------------
function(prompt_tokens var err)
  if(NOT err MATCHES "prompt: +([0-9]+) tokens")
    fail("no prompt token count on stderr:\n${err}")
  endif()
  set(${var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()
run(chat -p "Hi" --chat --system "Be brief." -n 4 --temp 0)
if(NOT chat_err MATCHES "chat template from the file \\(tokenizer.chat_template")
  fail("--chat did not say it renders the file's template:\n${chat_err}")
endif()
run(chat_nosys -p "Hi" --chat -n 4 --temp 0)
prompt_tokens(with_system "${chat_err}")
prompt_tokens(without_system "${chat_nosys_err}")
if(NOT with_system EQUAL without_system)
  fail("Phi-3's template drops system messages, but --system changed the prompt from "
       "${without_system} to ${with_system} tokens")
endif()
get_filename_component(run_dir ${GGUF} DIRECTORY)
file(WRITE ${run_dir}/all_roles.jinja
     "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
     "<|assistant|>\n{% if enable_thinking is defined %}"
     "{{ raise_exception('thinking was ' ~ enable_thinking) }}{% endif %}")
run(own -p "Hi" --chat --system "Be brief." -n 4 --temp 0 --chat-template-file
    ${run_dir}/all_roles.jinja)
prompt_tokens(own_tokens "${own_err}")
if(NOT own_tokens GREATER with_system OR NOT own_err MATCHES "chat template from .*all_roles")
  fail("--chat-template-file with a system turn gave ${own_tokens} prompt tokens (the file's "
       "template: ${with_system}):\n${own_err}")
endif()
execute_process(COMMAND ${RUN} -m ${GGUF} -p "Hi" --chat -n 4 --temp 0 -t 1
                        --chat-template-file ${run_dir}/all_roles.jinja
                        --chat-template-kwargs "{\"enable_thinking\": false}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "thinking was False")
  fail("--chat-template-kwargs did not reach the template (exit ${rc}):\n${err}")
endif()

# ---- refusals: before the model loads, nothing generated; each message names the flag and the
# value as given ("error: -n 40x: ..."): numbers must be whole and in their flag's range -------
foreach(bad "--min-p;2" "--min-p;-0.1" "--repeat-penalty;0" "--repeat-last-n;-2" "--top-p;0"
        "--top-p;1.5" "-n;40x" "-n;-5" "-n;1e3" "-t;-1" "-t;0" "-t;100000000" "-t;4.5" "-c;12k"
        "-c;-1" "-c;2147483648" "--temp;abc" "--temp;-1" "--temp;inf" "--top-k;-1" "--top-k;3x"
        "--repeat-last-n;x" "--frequency-penalty;nan" "--presence-penalty;1e99" "--seed;-3"
        "--seed;0x10" "--logit-bias;15043" "--logit-bias;x+1" "--logit-bias;15043+inf"
        "-l;15043+nan" "-l;15043*2" "--logit-bias;40000+1"
        "--chat-template-kwargs;[1]" "--chat-template-kwargs;{x}")
  execute_process(COMMAND ${RUN} -m ${GGUF} -p "x" ${bad}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  list(GET bad 0 flag)
  list(GET bad 1 value)
  string(FIND "${err}" "error: ${flag} ${value}: " named)
  if(rc EQUAL 0 OR named EQUAL -1 OR err MATCHES "loaded in")
    fail("'${bad}' was not refused before loading with 'error: ${flag} ${value}: ...' (exit "
         "${rc}):\n${err}")
  endif()
endforeach()
execute_process(COMMAND ${RUN} -m ${GGUF} -p "x" -n
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "error: -n needs a value")
  fail("a trailing -n was not refused as needing a value (exit ${rc}):\n${err}")
endif()

# ---- the Hugging Face directory (bf16): vocabulary from --vocab; none: a clear refusal ---------
execute_process(COMMAND ${RUN} -m ${MODEL_DIR} --vocab ${VOCAB} -p "The capital of France is"
                        -n 8 --temp 0 -t 1
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT err MATCHES "bf16 weights" OR NOT err MATCHES "generation: +8 tokens"
   OR NOT out MATCHES "^The capital of France is")
  fail("-m <directory> --vocab did not generate 8 tokens with bf16 weights (exit ${rc}):\n${err}")
endif()
execute_process(COMMAND ${RUN} -m ${MODEL_DIR} -p "x"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "--vocab VOCAB.gguf" OR NOT err MATCHES "tokenizer.json")
  fail("-m <directory> without a GGUF vocabulary was not refused saying what it needs "
       "(exit ${rc}):\n${err}")
endif()

# ---- constrained output: a GBNF grammar and a JSON Schema (sampled, so that an unconstrained
# model would wander): the text is in the grammar / parses as the schema says; a malformed
# grammar is refused naming its line and column ----------------------------------------------
execute_process(COMMAND ${RUN} -m ${GGUF} -p "Answer:" -n 20 --temp 1.5 --seed 5 -t 1
                        --grammar "root ::= (\"yes\" | \"no\") \"!\""
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^Answer:(yes|no)!\n$")
  fail("--grammar did not constrain the output to 'yes!' or 'no!' (exit ${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${RUN} -m ${GGUF} -p "" -n 60 --temp 1.5 --seed 7 -t 1 -j
                        "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 10, \"maximum\": 99}}, \"required\": [\"n\"], \"additionalProperties\": false}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^{\"n\": [1-9][0-9]}\n$")
  fail("-j did not give {\"n\": <10..99>} (exit ${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${RUN} -m ${GGUF} -p "x" --grammar "root ::= [a-"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "GBNF line 1, column 13")
  fail("a malformed --grammar was not refused naming line and column (exit ${rc}):\n${err}")
endif()
