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

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

# tok 1, pos 1, 4 x (LN 2 + attention 4), 4 x (LN 2 + 2 Linear x 2), LN_f 2, lm_head 2
set(n_params 54)
run_example("the single process" ref ${exe} ${common})
masters_hash(ref_hash "${ref}" "step 3")

foreach(c ${cases})
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 ranks)
  list(GET c 1 plan)
  set(label "--plan ${plan} on ${ranks} rank(s)")
  run_example("${label}" out ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan})
  masters_hash(hash "${out}" "step 3")
  if(plan STREQUAL "data=1,tensor=1,pipeline=1" AND NOT hash STREQUAL ref_hash)
    message(FATAL_ERROR "${label}: masters fnv1a ${hash}, the single process ${ref_hash}: they "
                        "must be bit-identical")
  endif()
  compare_signatures("${label} against the single process" "${out}" "${ref}" ${n_params}
                     ${tolerance} worst)
  message(STATUS "${label}: masters fnv1a ${hash}, largest signature difference ${worst} "
                 "(tolerance ${tolerance})")
endforeach()
