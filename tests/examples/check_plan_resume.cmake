# Plan checkpoints from train_fashion_mnist (--plan with --checkpoint / --resume), under mpiexec:
#  1. the plan trained 2 epochs, uninterrupted: its "masters fnv1a" hash and signatures;
#  2. the same plan trained 1 epoch with --checkpoint DIR, then resumed from DIR for epoch 2:
#     the same hash, bit for bit;
#  3. a single process resumed from DIR (merged into DIR/merged.tsr) for epoch 2: each
#     "masters signature" within `tolerance` (1e-6 units) of the plan's own epoch 2 (the single
#     process sums the fp32 gradients in another order; see check_plan_example.cmake);
#  4. a run of another plan refuses DIR, naming both plans, before training;
#  5. (with other_extra) the same plan with other_extra instead of extra (another --zero stage)
#     refuses DIR, naming both stages.
# Optional: `precision` (--precision for every run, the single process's too), `extra` (a list:
# flags for every plan run, e.g. "--zero;1"), `resume_extra` (flags
# for the resumed run only, e.g. "--recompute": a switch that is not training state), and
# `other_extra`.
# -D exe=... -D mpiexec=... -D np_flag=... -D ranks=N -D plan=... -D other_plan=...
# -D other_ranks=N -D dir=... -D tolerance=N [-D precision=...] [-D extra=...]
# [-D resume_extra=...] [-D other_extra=...]
set(common --limit 192 --batch 48 --test-limit 100 --no-progress --threads 1 --seed 5)
if(DEFINED precision)
  list(APPEND common --precision ${precision})
endif()
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
set(ck ${dir}/plan_ck)

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

set(mpi ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan} ${extra})
run_example("--plan ${plan}, 2 epochs" whole ${mpi} --epochs 2)
masters_hash(whole_hash "${whole}" "epoch 2")
run_example("--plan ${plan}, epoch 1 with --checkpoint" first ${mpi} --epochs 1 --checkpoint ${ck})
if(NOT EXISTS ${ck}/manifest.txt)
  message(FATAL_ERROR "--plan ${plan} --checkpoint ${ck} wrote no manifest.txt")
endif()
run_example("--plan ${plan} ${extra}, epoch 2 resumed ${resume_extra}" resumed ${mpi} --epochs 2
            --resume ${ck} ${resume_extra})
if(resumed MATCHES "epoch 1 ")
  message(FATAL_ERROR "the resumed run trained epoch 1 again:\n${resumed}")
endif()
masters_hash(resumed_hash "${resumed}" "epoch 2")
if(NOT resumed_hash STREQUAL whole_hash)
  message(FATAL_ERROR "--plan ${plan} ${extra}: 2 epochs give masters ${whole_hash}, 1 epoch + "
                      "resume ${resume_extra} gives ${resumed_hash}: they must be bit-identical")
endif()
message(STATUS "--plan ${plan} ${extra}: 2 epochs and 1 + resume ${resume_extra} 1 both give "
               "masters ${whole_hash}")

run_example("a single process resumed from the plan checkpoint" single ${exe} ${common}
            --epochs 2 --resume ${ck})
if(NOT EXISTS ${ck}/merged.tsr)
  message(FATAL_ERROR "the single-process resume did not merge ${ck} into ${ck}/merged.tsr")
endif()
compare_signatures("the single process resumed from the merged plan checkpoint, against the plan"
                   "${single}" "${whole}" 8 ${tolerance} worst)
message(STATUS "the single process resumed from the merged plan checkpoint: largest signature "
               "difference ${worst} (tolerance ${tolerance})")

execute_process(COMMAND ${mpiexec} ${np_flag} ${other_ranks} ${exe} ${common} --plan
                        ${other_plan} ${extra} --epochs 2 --resume ${ck}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
if(rc EQUAL 0 OR NOT err MATCHES "holds a run of plan\\(" OR out MATCHES "epoch 2 ")
  message(FATAL_ERROR "--plan ${other_plan} resumed a checkpoint of --plan ${plan} (exit ${rc}):"
                      "\nstdout: ${out}\nstderr: ${err}")
endif()
message(STATUS "--plan ${other_plan} refused the checkpoint of --plan ${plan}")

if(DEFINED other_extra)
  execute_process(COMMAND ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan}
                          ${other_extra} --epochs 2 --resume ${ck}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
  if(rc EQUAL 0 OR NOT err MATCHES "at ZeRO stage [0-2], not at ZeRO stage [0-2]"
     OR out MATCHES "epoch 2 ")
    message(FATAL_ERROR "--plan ${plan} ${other_extra} resumed a checkpoint of --plan ${plan} "
                        "${extra} (exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
  endif()
  message(STATUS "--plan ${plan} ${other_extra} refused the checkpoint of --plan ${plan} "
                 "${extra}")
endif()
