# Plan checkpoints from train_char_gpt (--plan with --checkpoint DIR / --stop-at / --resume
# DIR), under mpiexec:
#  1. the plan trained 6 steps, uninterrupted: its "masters fnv1a" hash, its "step N val loss"
#     lines (steps 0, 3, 6: the validation forward through the plan) and its sample (generated
#     from the gathered whole weights);
#  2. the same plan stopped after step 3 with --checkpoint DIR, then resumed from DIR to step 6:
#     the same hash bit for bit (masters, AdamW moments and schedule position restored), the
#     same step 6 validation loss and the same sample; steps 1 to 3 not trained again;
#  3. a run of another plan refuses DIR, naming both plans, before training.
# -D exe=... -D mpiexec=... -D np_flag=... -D ranks=N -D plan=... -D other_ranks=N
# -D other_plan=... -D dir=... [-D precision=fp32|bf16|fp8] (bf16 and fp8: the dynamic loss
# scaler's state and the fp8 scaling states restored too)
set(common --steps 6 --warmup 1 --batch 4 --eval-every 3 --sample-len 40 --no-progress
           --threads 1 --seed 3)
if(DEFINED precision)
  list(APPEND common --precision ${precision})
endif()
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
set(ck ${dir}/plan_ck)

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

# The "step N val loss X" line for step `step` in `text`, into out_var (fatal when missing).
function(val_loss_line out_var text step label)
  string(REGEX MATCH "step ${step} val loss [0-9.]+" m "${text}")
  if(NOT m)
    message(FATAL_ERROR "${label}: no 'step ${step} val loss' line in:\n${text}")
  endif()
  set(${out_var} "${m}" PARENT_SCOPE)
endfunction()

# The sample: everything after the "sample (...):" line.
function(sample_text out_var text label)
  string(FIND "${text}" "sample (temperature" at)
  if(at LESS 0)
    message(FATAL_ERROR "${label}: no sample in:\n${text}")
  endif()
  string(SUBSTRING "${text}" ${at} -1 s)
  set(${out_var} "${s}" PARENT_SCOPE)
endfunction()

set(mpi ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan})
run_example("--plan ${plan}, 6 steps" whole ${mpi})
masters_hash(whole_hash "${whole}" "step 6")
foreach(step 0 3 6)
  val_loss_line(line "${whole}" ${step} "--plan ${plan}")
endforeach()
val_loss_line(whole_val "${whole}" 6 "--plan ${plan}")
sample_text(whole_sample "${whole}" "--plan ${plan}")

run_example("--plan ${plan}, stopped after step 3 with --checkpoint" first ${mpi} --stop-at 3
            --checkpoint ${ck})
if(NOT EXISTS ${ck}/manifest.txt)
  message(FATAL_ERROR "--plan ${plan} --checkpoint ${ck} wrote no manifest.txt")
endif()
masters_hash(first_hash "${first}" "step 3")
run_example("--plan ${plan}, resumed to step 6" resumed ${mpi} --resume ${ck})
if(resumed MATCHES "step [123] train loss" OR resumed MATCHES "step 0 val loss")
  message(FATAL_ERROR "the resumed run trained or evaluated steps 0 to 3 again:\n${resumed}")
endif()
masters_hash(resumed_hash "${resumed}" "step 6")
if(NOT resumed_hash STREQUAL whole_hash)
  message(FATAL_ERROR "--plan ${plan}: 6 steps give masters ${whole_hash}, 3 + resume 3 give "
                      "${resumed_hash}: they must be bit-identical")
endif()
val_loss_line(resumed_val "${resumed}" 6 "--plan ${plan} resumed")
if(NOT resumed_val STREQUAL whole_val)
  message(FATAL_ERROR "--plan ${plan}: '${whole_val}' uninterrupted, '${resumed_val}' resumed")
endif()
sample_text(resumed_sample "${resumed}" "--plan ${plan} resumed")
if(NOT resumed_sample STREQUAL whole_sample)
  message(FATAL_ERROR "--plan ${plan}: the resumed run's sample differs:\n${whole_sample}\n"
                      "---\n${resumed_sample}")
endif()
message(STATUS "--plan ${plan}: 6 steps and 3 + resume 3 both give masters ${whole_hash}, "
               "'${whole_val}' and the same sample")

execute_process(COMMAND ${mpiexec} ${np_flag} ${other_ranks} ${exe} ${common} --plan
                        ${other_plan} --resume ${ck}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
if(rc EQUAL 0 OR NOT err MATCHES "holds a run of plan\\(" OR out MATCHES "train loss")
  message(FATAL_ERROR "--plan ${other_plan} resumed a checkpoint of --plan ${plan} (exit ${rc}):"
                      "\nstdout: ${out}\nstderr: ${err}")
endif()
message(STATUS "--plan ${other_plan} refused the checkpoint of --plan ${plan}")
