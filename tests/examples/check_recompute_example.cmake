# Runs train_fashion_mnist with and without --recompute (nn::Recompute segments, the weights
# copied from the unwrapped model) in each precision of `precisions` on the same few hundred
# images and requires the same "masters fnv1a" hash after training: recomputation changes no bit
# of the gradients. Also requires the saved-activation bytes it prints per step to be smaller
# with --recompute.
# Then (with -D dir=...) resumes are free to switch it: 2 epochs without it against 1 epoch with
# --checkpoint and a --resume for epoch 2 with --recompute (and the other way round), the same
# hash bit for bit; and (with -D mpiexec=... -D np_flag=... -D plan=... -D ranks=N) the plan run
# with and without --recompute, the same hash.
# -D exe=... -D precisions="fp32;bf16;..." [-D dir=...] [-D mpiexec=... -D np_flag=... -D plan=...
# -D ranks=N]
set(common --limit 192 --batch 48 --test-limit 100 --no-progress --threads 1 --seed 3)

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

function(saved_bytes out_var label)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${label} failed (exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
  endif()
  string(REGEX MATCH "saved activations between forward and backward: ([0-9]+) bytes" m "${err}")
  if(NOT m)
    message(FATAL_ERROR "${label}: no 'saved activations' line in:\n${err}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${out_var}_stdout "${out}" PARENT_SCOPE)
endfunction()

foreach(p ${precisions})
  saved_bytes(plain "--precision ${p}" ${exe} ${common} --precision ${p})
  saved_bytes(rec "--precision ${p} --recompute" ${exe} ${common} --precision ${p} --recompute)
  masters_hash(h_plain "${plain_stdout}" "epoch 1")
  masters_hash(h_rec "${rec_stdout}" "epoch 1")
  if(NOT h_plain STREQUAL h_rec)
    message(FATAL_ERROR "--precision ${p}: masters fnv1a ${h_rec} with --recompute, ${h_plain} "
                        "without: they must be bit-identical")
  endif()
  if(NOT rec LESS plain)
    message(FATAL_ERROR "--precision ${p}: ${rec} saved bytes with --recompute, ${plain} "
                        "without")
  endif()
  message(STATUS "--precision ${p}: masters fnv1a ${h_rec} with and without --recompute; saved "
                 "activations ${plain} -> ${rec} bytes per step")
endforeach()

if(DEFINED dir)
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir})
  run_example("2 epochs" whole ${exe} ${common} --epochs 2)
  masters_hash(h_whole "${whole}" "epoch 2")
  foreach(first_flag second_flag IN ZIP_LISTS "--no-progress;--recompute" "--recompute;--no-progress")
    run_example("epoch 1 ${first_flag} --checkpoint" first ${exe} ${common} ${first_flag} --epochs 1
                --checkpoint ${dir}/ck.tsr)
    run_example("epoch 2 ${second_flag} --resume" second ${exe} ${common} ${second_flag}
                --epochs 2 --resume ${dir}/ck.tsr)
    masters_hash(h_second "${second}" "epoch 2")
    if(NOT h_second STREQUAL h_whole)
      message(FATAL_ERROR "epoch 1 with ${first_flag}, resumed with ${second_flag}: masters "
                          "${h_second}, 2 epochs uninterrupted ${h_whole}: they must be "
                          "bit-identical")
    endif()
    message(STATUS "epoch 1 ${first_flag} + resume ${second_flag}: masters ${h_second}, as 2 epochs")
  endforeach()
endif()

if(DEFINED plan)
  set(mpi ${mpiexec} ${np_flag} ${ranks} ${exe} ${common} --plan ${plan})
  run_example("--plan ${plan}" plain ${mpi})
  run_example("--plan ${plan} --recompute" rec ${mpi} --recompute)
  masters_hash(h_plain "${plain}" "epoch 1")
  masters_hash(h_rec "${rec}" "epoch 1")
  if(NOT h_plain STREQUAL h_rec)
    message(FATAL_ERROR "--plan ${plan}: masters fnv1a ${h_rec} with --recompute, ${h_plain} "
                        "without: they must be bit-identical")
  endif()
  message(STATUS "--plan ${plan}: masters fnv1a ${h_rec} with and without --recompute")
endif()
