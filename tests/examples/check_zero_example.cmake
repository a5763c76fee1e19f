# train_fashion_mnist --plan P --zero 1|2 against the same --plan without --zero, on the same
# few hundred images: ZeRO changes where the optimizer runs, not what it computes.
#  - stages 1 and 2 reduce-scatter the gradients instead of all-reducing them (MPI may order a
#    sum of more than two terms differently) and update each weight element by the same
#    arithmetic: the "masters fnv1a" hash bit-identical when the data degree is at most 2, else
#    each weight signature within `tolerance` (1e-6 units) of the unsharded run's;
#  - both print their memory line ("zero stage S, D=..., ... bytes/parameter; formula ...").
# -D exe=... -D mpiexec=... -D np_flag=... -D cases="ranks|plan|data;..." -D tolerance=N
# [-D precision=fp32|bf16|fp8]
set(common --limit 192 --batch 48 --test-limit 100 --no-progress --threads 1 --seed 3)
if(DEFINED precision)
  list(APPEND common --precision ${precision})
endif()

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

foreach(c ${cases})
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 ranks)
  list(GET c 1 plan)
  list(GET c 2 data)
  run_example("--plan ${plan}" ref ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan})
  masters_hash(ref_hash "${ref}" "epoch 1")
  foreach(stage 1 2)
    set(label "--plan ${plan} --zero ${stage} on ${ranks} rank(s)")
    run_example("${label}" out ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan}
                --zero ${stage})
    masters_hash(hash "${out}" "epoch 1")
    string(REGEX MATCH "zero stage ${stage}, D=${data}, optimizer SGD with momentum[^\n]*"
                 memory_line "${out}")
    if(NOT memory_line)
      message(FATAL_ERROR "${label}: no 'zero stage ${stage}, D=${data}, ...' memory line in:\n"
                          "${out}")
    endif()
    message(STATUS "${label}: ${memory_line}")
    if(data LESS_EQUAL 2)
      if(NOT hash STREQUAL ref_hash)
        message(FATAL_ERROR "${label}: masters fnv1a ${hash}, without --zero ${ref_hash}: they "
                            "must be bit-identical")
      endif()
      message(STATUS "${label}: masters fnv1a ${hash}, bit-identical to the unsharded run")
    else()
      compare_signatures("${label} against the unsharded run" "${out}" "${ref}" 8 ${tolerance}
                         worst)
      message(STATUS "${label}: largest signature difference ${worst} (tolerance ${tolerance})")
    endif()
  endforeach()
endforeach()
