# Runs train_fashion_mnist once as a single process and then under --plan with mpiexec, on the
# same few hundred images in batches every plan splits evenly, and compares the weights they end
# with (the lines the example prints after training):
#  - plan data=1,tensor=1,pipeline=1 on one rank computes exactly what the single process does:
#    the same "masters fnv1a" hash, bit for bit;
#  - the other plans sum the fp32 gradients in another order (over data replicas, tensor ranks,
#    micro-batches), so each "masters signature NAME S" (S = 1e6 x the sum of the parameter's
#    weights with pseudo-random signs) must lie within `tolerance` (in 1e-6 units) of the single
#    process's.
# Optional: `ref_args` (a list of flags for the single process only, e.g. "--batch;96") and
# `plan_args` (for every plan run, e.g. "--accum;2": 2 batches of 48 per step against the single
# process's batches of 96).
# -D exe=... -D mpiexec=... -D np_flag=... -D cases="ranks|plan;ranks|plan;..." -D tolerance=N
# [-D ref_args=...] [-D plan_args=...] [-D precision=fp32|bf16|fp8] (default: the example's, fp32)
set(common --limit 192 --batch 48 --test-limit 100 --no-progress --threads 1 --seed 3)
if(DEFINED precision)
  list(APPEND common --precision ${precision})
endif()

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

run_example("the single process ${ref_args}" ref ${exe} ${common} ${ref_args})
masters_hash(ref_hash "${ref}" "epoch 1")
message(STATUS "single process: masters fnv1a ${ref_hash}")

foreach(c ${cases})
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 ranks)
  list(GET c 1 plan)
  set(label "--plan ${plan} ${plan_args} on ${ranks} rank(s)")
  run_example("${label}" out ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan}
              ${plan_args})
  masters_hash(hash "${out}" "epoch 1")
  if(plan STREQUAL "data=1,tensor=1,pipeline=1" AND NOT DEFINED plan_args)
    if(NOT hash STREQUAL ref_hash)
      message(FATAL_ERROR "--plan ${plan} on one rank: masters fnv1a ${hash}, the single "
                          "process ${ref_hash}: they must be bit-identical")
    endif()
  endif()
  compare_signatures("${label} against the single process" "${out}" "${ref}" 8 ${tolerance} worst)
  message(STATUS "${label}: masters fnv1a ${hash}, largest signature difference ${worst} "
                 "(tolerance ${tolerance})")
endforeach()
