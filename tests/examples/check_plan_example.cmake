# Runs train_fashion_mnist once as a single process and then under --plan with mpiexec, on the
# same few hundred images in batches every plan splits evenly, and compares the weights they end
# with (the lines the example prints after training):
#  - plan data=1,tensor=1,pipeline=1 on one rank computes exactly what the single process does:
#    the same "masters fnv1a" hash, bit for bit;
#  - the other plans sum the fp32 gradients in another order (over data replicas, tensor ranks,
#    micro-batches), so each "masters signature NAME S" (S = 1e6 x the sum of the parameter's
#    weights with pseudo-random signs) must lie within `tolerance` (in 1e-6 units) of the single
#    process's.
# -D exe=... -D mpiexec=... -D np_flag=... -D cases="ranks|plan;ranks|plan;..." -D tolerance=N
set(common --limit 192 --batch 48 --test-limit 100 --no-progress --threads 1 --seed 3)

function(run_and_parse label out_hash out_sigs)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${label} failed (exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
  endif()
  string(REGEX MATCH "masters fnv1a ([0-9a-f]+) after epoch 1" m "${out}")
  if(NOT m)
    message(FATAL_ERROR "${label} printed no weight hash:\n${out}\n${err}")
  endif()
  set(${out_hash} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  string(REGEX MATCHALL "masters signature [^ \n]+ -?[0-9]+" sigs "${out}")
  list(LENGTH sigs n)
  if(NOT n EQUAL 8)
    message(FATAL_ERROR "${label}: expected 8 signature lines (FashionCNN's parameters), got "
                        "${n}:\n${out}")
  endif()
  set(${out_sigs} "${sigs}" PARENT_SCOPE)
endfunction()

run_and_parse("the single process" ref_hash ref_sigs ${exe} ${common})
message(STATUS "single process: masters fnv1a ${ref_hash}")

foreach(c ${cases})
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 ranks)
  list(GET c 1 plan)
  run_and_parse("--plan ${plan} on ${ranks} rank(s)" hash sigs ${mpiexec} ${np_flag} ${ranks}
                ${exe} ${common} --plan ${plan})
  if(plan STREQUAL "data=1,tensor=1,pipeline=1")
    if(NOT hash STREQUAL ref_hash)
      message(FATAL_ERROR "--plan ${plan} on one rank: masters fnv1a ${hash}, the single "
                          "process ${ref_hash}: they must be bit-identical")
    endif()
  endif()
  set(worst 0)
  foreach(line ${sigs})
    string(REGEX MATCH "masters signature ([^ ]+) (-?[0-9]+)" m "${line}")
    set(name ${CMAKE_MATCH_1})
    set(value ${CMAKE_MATCH_2})
    set(ref "")
    foreach(rline ${ref_sigs})
      if(rline MATCHES "masters signature ${name} (-?[0-9]+)")
        set(ref ${CMAKE_MATCH_1})
      endif()
    endforeach()
    if(ref STREQUAL "")
      message(FATAL_ERROR "--plan ${plan}: parameter ${name} is not the single process's")
    endif()
    math(EXPR diff "${value} - ${ref}")
    if(diff LESS 0)
      math(EXPR diff "0 - ${diff}")
    endif()
    if(diff GREATER worst)
      set(worst ${diff})
    endif()
    if(diff GREATER tolerance)
      message(FATAL_ERROR "--plan ${plan} on ${ranks} ranks: ${name}'s signature ${value}, the "
                          "single process's ${ref} (difference ${diff} > ${tolerance})")
    endif()
  endforeach()
  message(STATUS "--plan ${plan} on ${ranks} rank(s): masters fnv1a ${hash}, largest signature "
                 "difference ${worst} (tolerance ${tolerance})")
endforeach()
