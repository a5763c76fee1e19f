# Shared by check_plan_example.cmake, check_plan_resume.cmake (train_fashion_mnist) and
# check_char_gpt_plan.cmake (train_char_gpt): running an example and comparing the "masters
# fnv1a H after ..." hash and the "masters signature NAME S" lines it prints after training (S =
# 1e6 x the sum of the parameter's weights with pseudo-random signs; see the examples).

# run_example(label out_var command...): runs the command; its stdout in out_var, or a fatal
# error naming `label` with the exit code, stdout and stderr.
function(run_example label out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${label} failed (exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# The "masters fnv1a H after WHEN" hash in `text` (WHEN e.g. "epoch 2" or "step 3"), into
# out_var (fatal when there is none).
function(masters_hash out_var text when)
  string(REGEX MATCH "masters fnv1a ([0-9a-f]+) after ${when}" m "${text}")
  if(NOT m)
    message(FATAL_ERROR "no 'masters fnv1a ... after ${when}' line in:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# compare_signatures(label got_text ref_text count tolerance worst_var): both outputs must hold
# one signature line per parameter (`count` of them: 8 for FashionCNN); each of got_text's must
# lie within `tolerance` (1e-6 units) of ref_text's line of the same name. The largest
# difference goes to worst_var.
function(compare_signatures label got_text ref_text count tolerance worst_var)
  string(REGEX MATCHALL "masters signature [^ \n]+ -?[0-9]+" got "${got_text}")
  string(REGEX MATCHALL "masters signature [^ \n]+ -?[0-9]+" ref "${ref_text}")
  list(LENGTH got n_got)
  list(LENGTH ref n_ref)
  if(NOT n_got EQUAL count OR NOT n_ref EQUAL count)
    message(FATAL_ERROR "${label}: expected ${count} signature lines each (one per parameter), "
                        "got ${n_got} and ${n_ref}:\n${got_text}\n${ref_text}")
  endif()
  set(worst 0)
  foreach(line ${got})
    string(REGEX MATCH "masters signature ([^ ]+) (-?[0-9]+)" m "${line}")
    set(name ${CMAKE_MATCH_1})
    set(value ${CMAKE_MATCH_2})
    string(REPLACE "." "\\." name_re "${name}") # names like "3.qkv.weight"
    set(want "")
    foreach(rline ${ref})
      if(rline MATCHES "masters signature ${name_re} (-?[0-9]+)")
        set(want ${CMAKE_MATCH_1})
      endif()
    endforeach()
    if(want STREQUAL "")
      message(FATAL_ERROR "${label}: the reference printed no signature for ${name}")
    endif()
    math(EXPR diff "${value} - ${want}")
    if(diff LESS 0)
      math(EXPR diff "0 - ${diff}")
    endif()
    if(diff GREATER worst)
      set(worst ${diff})
    endif()
    if(diff GREATER tolerance)
      message(FATAL_ERROR "${label}: ${name}'s signature ${value}, the reference's ${want} "
                          "(difference ${diff} > ${tolerance})")
    endif()
  endforeach()
  set(${worst_var} ${worst} PARENT_SCOPE)
endfunction()
