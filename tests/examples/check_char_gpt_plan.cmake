# Runs train_char_gpt once as a single process and then under --plan with mpiexec, a few steps
# on the same batches, and compares the weights they end with (the lines the example prints
# after training):
#  - plan data=1,tensor=1,pipeline=1 on one rank computes exactly what the single process does:
#    the same "masters fnv1a" hash, bit for bit;
#  - the other plans sum the fp32 gradients in another order (over data replicas, tensor ranks,
#    micro-batches; the global norm for clipping over the stages), so each "masters signature
#    NAME S" (S = 1e6 x the sum of the parameter's weights with pseudo-random signs) must lie
#    within `tolerance` (in 1e-6 units) of the single process's line of the same name.
# -D exe=... -D mpiexec=... -D np_flag=... -D cases="ranks|plan;..." -D tolerance=N
set(common --steps 3 --warmup 1 --batch 4 --eval-every 3 --sample-len 0 --no-progress --threads 1
           --seed 3)

function(run_example label out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${label} failed (exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(hash_of out_var text)
  string(REGEX MATCH "masters fnv1a ([0-9a-f]+) after step 3" m "${text}")
  if(NOT m)
    message(FATAL_ERROR "no 'masters fnv1a ... after step 3' line in:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

run_example("the single process" ref ${exe} ${common})
hash_of(ref_hash "${ref}")
string(REGEX MATCHALL "masters signature [^ \n]+ -?[0-9]+" ref_sigs "${ref}")
list(LENGTH ref_sigs n_ref)
# tok 1, pos 1, 4 x (LN 2 + attention 4), 4 x (LN 2 + 2 Linear x 2), LN_f 2, lm_head 2
if(NOT n_ref EQUAL 54)
  message(FATAL_ERROR "the single process printed ${n_ref} signature lines, not 54:\n${ref}")
endif()

foreach(c ${cases})
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 ranks)
  list(GET c 1 plan)
  set(label "--plan ${plan} on ${ranks} rank(s)")
  run_example("${label}" out ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan})
  hash_of(hash "${out}")
  if(plan STREQUAL "data=1,tensor=1,pipeline=1" AND NOT hash STREQUAL ref_hash)
    message(FATAL_ERROR "${label}: masters fnv1a ${hash}, the single process ${ref_hash}: they "
                        "must be bit-identical")
  endif()
  string(REGEX MATCHALL "masters signature [^ \n]+ -?[0-9]+" got "${out}")
  list(LENGTH got n_got)
  if(NOT n_got EQUAL n_ref)
    message(FATAL_ERROR "${label}: ${n_got} signature lines, the single process ${n_ref}")
  endif()
  set(worst 0)
  foreach(line ${got})
    string(REGEX MATCH "masters signature ([^ ]+) (-?[0-9]+)" m "${line}")
    set(name ${CMAKE_MATCH_1})
    set(value ${CMAKE_MATCH_2})
    string(REPLACE "." "\\." name_re "${name}")
    string(REGEX MATCH "masters signature ${name_re} (-?[0-9]+)" m "${ref}")
    if(NOT m)
      message(FATAL_ERROR "${label}: the single process printed no signature for ${name}")
    endif()
    math(EXPR diff "${value} - ${CMAKE_MATCH_1}")
    if(diff LESS 0)
      math(EXPR diff "-(${diff})")
    endif()
    if(diff GREATER worst)
      set(worst ${diff})
    endif()
    if(diff GREATER tolerance)
      message(FATAL_ERROR "${label}: signature of ${name} is ${value}, the single process's "
                          "${CMAKE_MATCH_1} (difference ${diff} > tolerance ${tolerance})")
    endif()
  endforeach()
  message(STATUS "${label}: masters fnv1a ${hash}, largest signature difference ${worst} "
                 "(tolerance ${tolerance})")
endforeach()
