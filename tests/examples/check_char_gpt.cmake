# The character GPT example (examples/train_char_gpt.cpp), a few steps each:
#   smoke: the output has `val loss <number>` lines and a sample of the asked length;
#   resume: A: --steps 4;  B: --steps 4 --stop-at 2 --checkpoint F;  C: --steps 4 --resume F
#           hash(A) == hash(C) (bit-identical resume, schedule position and AdamW state from the
#           file), hash(B) != hash(A) (the last steps changed something), C trained 2 steps
#           only (it continued from F); with --accum 2 as well.
#   sizes: --layers 1 --width 64 --heads 2 --context 32: the parameter count of that shape
#          (hand-computed), val loss lines, a sample, a bit-identical resume at that size; its
#          checkpoint refused (exit 1, naming this run's size) by runs of another --layers,
#          --width/--heads or --context (the last has the same parameters: only the size record
#          in the checkpoint tells); an unsupported --width refused with the list of pairs.
# -D exe=... -D mode=smoke|resume|sizes -D dir=... (a scratch directory)
set(common --batch 4 --eval-every 2 --no-progress --threads 1 --sample-len 40)
file(MAKE_DIRECTORY ${dir})
function(run out_var)
  execute_process(COMMAND ${exe} ${common} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${exe} ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
function(hash_of out_var text)
  string(REGEX MATCH "masters fnv1a ([0-9a-f]+) after step ([0-9]+)" m "${text}")
  if(NOT m)
    message(FATAL_ERROR "no hash line in the output:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}@${CMAKE_MATCH_2}" PARENT_SCOPE)
endfunction()

if(mode STREQUAL "smoke")
  run(out --steps 3)
  string(REGEX MATCHALL "step [0-9]+ val loss [0-9]+\\.[0-9]+" vals "${out}")
  list(LENGTH vals n)
  # step 0, step 2, step 3
  if(NOT n EQUAL 3)
    message(FATAL_ERROR "expected 3 `val loss` lines, got ${n}:\n${out}")
  endif()
  if(NOT out MATCHES "sample \\(temperature 0.8, seed 1\\):\n")
    message(FATAL_ERROR "no sample in the output:\n${out}")
  endif()
  string(REGEX REPLACE ".*sample \\(temperature 0.8, seed 1\\):\n" "" sample "${out}")
  string(LENGTH "${sample}" len)
  # 40 characters and the closing newline
  if(NOT len EQUAL 41)
    message(FATAL_ERROR "the sample has ${len} characters, expected 40 and a newline:\n${sample}")
  endif()
  # A missing corpus is refused clearly, exit code 1.
  execute_process(COMMAND ${exe} ${common} --steps 1 --data ${dir}/no-such-dir RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "no-such-dir' does not exist")
    message(FATAL_ERROR "a missing corpus was not refused clearly (${rc}):\n${err}")
  endif()
  # A bad flag: exit code 2 and the usage line.
  execute_process(COMMAND ${exe} --steps 0 RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: train_char_gpt")
    message(FATAL_ERROR "--steps 0 was not refused with the usage line (${rc}):\n${err}")
  endif()
elseif(mode STREQUAL "resume")
  foreach(accum 1 2)
    set(ck ${dir}/resume_${accum}.tsr)
    file(REMOVE ${ck})
    run(a --steps 4 --accum ${accum} --sample-len 0)
    run(b --steps 4 --stop-at 2 --accum ${accum} --sample-len 0 --checkpoint ${ck})
    run(c --steps 4 --accum ${accum} --sample-len 0 --resume ${ck})
    hash_of(ha "${a}")
    hash_of(hb "${b}")
    hash_of(hc "${c}")
    message(STATUS "accum ${accum}: uninterrupted ${ha}, stopped ${hb}, resumed ${hc}")
    # C continued from the file, not from scratch (which would also give hash(A)): it trained
    # steps 3 and 4 only, 2 steps x 4 contexts x 128 characters, and evaluated no step 0.
    if(NOT c MATCHES "trained 1024 tokens" OR c MATCHES "step 0 val loss")
      message(FATAL_ERROR "the --resume run did not continue after step 2:\n${c}")
    endif()
    if(NOT ha STREQUAL hc)
      message(FATAL_ERROR "resumed run ${hc} differs from the uninterrupted run ${ha}")
    endif()
    if(ha STREQUAL hb)
      message(FATAL_ERROR "steps 3 and 4 changed nothing (${ha} == ${hb}): the test proves nothing")
    endif()
    # the val loss after step 4 is the same line in both
    string(REGEX MATCH "step 4 val loss [0-9.]+" la "${a}")
    string(REGEX MATCH "step 4 val loss [0-9.]+" lc "${c}")
    if(NOT la OR NOT la STREQUAL lc)
      message(FATAL_ERROR "val loss after step 4: '${la}' uninterrupted, '${lc}' resumed")
    endif()
  endforeach()
elseif(mode STREQUAL "sizes")
  set(small --layers 1 --width 64 --heads 2 --context 32)
  set(ck ${dir}/sizes.tsr)
  file(REMOVE ${ck})
  execute_process(COMMAND ${exe} ${common} ${small} --steps 4 --sample-len 40
                  RESULT_VARIABLE rc OUTPUT_VARIABLE a ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the small model failed (${rc}):\n${a}\n${err}")
  endif()
  # V = 128 (fortunes has 114 distinct bytes), D = 64, context bound 128 rows, one block:
  # tok 128*64 + pos 128*64 + block (LN 2*64, qkv 64*192+192, proj 64*64+64, LN 2*64,
  # fc 64*256+256, proj 256*64+64) + LN_f 2*64 + head 64*128+128 = 74 816
  if(NOT err MATCHES "fp32, layers 1, width 64, heads 2, context 32, vocabulary 114 \\(bound 128\\)"
     OR NOT err MATCHES " 74816 parameters, batch 4 x 32 ")
    message(FATAL_ERROR "the small model's header line is wrong:\n${err}")
  endif()
  if(NOT a MATCHES "step 4 val loss [0-9]+\\.[0-9]+" OR NOT a MATCHES "trained 512 tokens")
    message(FATAL_ERROR "no val loss / token count of 4 x 4 x 32 in:\n${a}")
  endif()
  string(REGEX REPLACE ".*sample \\(temperature 0.8, seed 1\\):\n" "" sample "${a}")
  string(LENGTH "${sample}" len)
  if(NOT len EQUAL 41)
    message(FATAL_ERROR "the sample has ${len} characters, expected 40 and a newline:\n${sample}")
  endif()
  run(b ${small} --steps 4 --stop-at 2 --sample-len 0 --checkpoint ${ck})
  run(c ${small} --steps 4 --sample-len 0 --resume ${ck})
  hash_of(ha "${a}")
  hash_of(hb "${b}")
  hash_of(hc "${c}")
  if(NOT ha STREQUAL hc OR ha STREQUAL hb)
    message(FATAL_ERROR "small model: uninterrupted ${ha}, stopped ${hb}, resumed ${hc}")
  endif()
  foreach(other "--layers;2;--width;64;--heads;2;--context;32"
                "--layers;1;--width;128;--heads;4;--context;32"
                "--layers;1;--width;64;--heads;2;--context;16")
    execute_process(COMMAND ${exe} ${common} ${other} --steps 4 --sample-len 0 --resume ${ck}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 1 OR NOT err MATCHES "train_char_gpt: cannot resume from .*sizes.tsr with this model \\(fp32, layers [12], width (64|128), heads [24], context (16|32);"
       OR NOT err MATCHES "resumes only the model size and precision it was saved with")
      message(FATAL_ERROR "${other}: the checkpoint of another size was not refused (${rc}):\n${err}")
    endif()
  endforeach()
  execute_process(COMMAND ${exe} --width 96 RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "supported width/heads pairs are 64/2, 128/4")
    message(FATAL_ERROR "--width 96 was not refused with the supported pairs (${rc}):\n${err}")
  endif()
else()
  message(FATAL_ERROR "mode must be smoke, resume or sizes, got '${mode}'")
endif()
