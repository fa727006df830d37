# npullm_run end to end (cmake -P) on a GGUF with a real tokenizer: a generated tiny Llama whose
# vocabulary size is Phi-3's, quantized to Q4_0 / Q8_0 by npullm_quantize with the tokenizer.*
# keys of ../shared/vocab/ggml-vocab-phi-3.gguf (random weights: the text means nothing, every
# step is real). Checks: the prompt echoed and the tokens/s lines; the same seed gives the same
# text with every sampling control on; the penalties change greedy text; --chat names the
# file's template; bad values are refused before the model loads; the model's Hugging Face
# directory runs with --vocab, and without a GGUF vocabulary is refused saying what it needs.
#   -DRUN=<npullm_run> -DGGUF=<the model file> -DMODEL_DIR=<its bf16 directory>
#   -DVOCAB=<the vocabulary GGUF>
cmake_minimum_required(VERSION 3.21)

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

# ---- --chat: the file's template (Phi-3) ------------------------------------------------------
run(chat -p "Hi" --chat --system "Be brief." -n 4 --temp 0)
if(NOT chat_err MATCHES "chat template phi")
  fail("--chat did not name the Phi-3 template:\n${chat_err}")
endif()

# ---- refusals: before the model loads, nothing generated --------------------------------------
foreach(bad "--min-p;2" "--repeat-penalty;0" "--repeat-last-n;-2" "--top-p;0")
  execute_process(COMMAND ${RUN} -m ${GGUF} -p "x" ${bad}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(rc EQUAL 0 OR NOT err MATCHES "error:" OR err MATCHES "loaded in")
    fail("'${bad}' was not refused before loading (exit ${rc}):\n${err}")
  endif()
endforeach()

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
