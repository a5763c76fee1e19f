# Runs train_char_gpt once as a single process and then under --plan with mpiexec, a few steps
# on the same batches, and compares the weights they end with (the lines the example prints
# after training):
#  - plan data=1,tensor=1,pipeline=1 on one rank computes exactly what the single process does:
#    the same "masters fnv1a" hash, bit for bit;
#  - the other plans sum the fp32 gradients in another order (over data replicas, tensor ranks,
#    micro-batches; the global norm for clipping over the stages), so each "masters signature
#    NAME S" (S = 1e6 x the sum of the parameter's weights with pseudo-random signs) must lie
#    within `tolerance` (in 1e-6 units) of the single process's line of the same name;
#  - the "step N val loss X" lines (steps 0 and 3; under a plan the validation forward runs
#    through the plan) equal the single process's for the one-rank plan and lie within 0.002 of
#    them otherwise (a few fp32 ulps in the weights move a 4-decimal loss by < 1e-4; a wrong
#    share of the validation batches or a missing reduction by far more); the sample, generated
#    after training (from the gathered whole weights under a plan), is the single process's for
#    the one-rank plan.
# -D exe=... -D mpiexec=... -D np_flag=... -D cases="ranks|plan;..." -D tolerance=N
# [-D precision=fp32|bf16|fp8] [-D val_tolerance=N] (the validation loss bound in 1e-4 units,
# default 20)
set(common --steps 3 --warmup 1 --batch 4 --eval-every 3 --sample-len 20 --no-progress --threads 1
           --seed 3)
if(DEFINED precision)
  list(APPEND common --precision ${precision})
endif()
if(NOT DEFINED val_tolerance)
  set(val_tolerance 20)
endif()

include(${CMAKE_CURRENT_LIST_DIR}/plan_signatures.cmake)

# tok 1, pos 1, 4 x (LN 2 + attention 4), 4 x (LN 2 + 2 Linear x 2), LN_f 2, lm_head 2
set(n_params 54)
run_example("the single process" ref ${exe} ${common})
masters_hash(ref_hash "${ref}" "step 3")

# The validation loss of step `step` in `text` in 1e-4 units (an integer), into out_var.
function(val_loss out_var text step label)
  string(REGEX MATCH "step ${step} val loss ([0-9]+)\\.([0-9][0-9][0-9][0-9])" m "${text}")
  if(NOT m)
    message(FATAL_ERROR "${label}: no 'step ${step} val loss' line in:\n${text}")
  endif()
  string(REGEX REPLACE "^0+([0-9])" "\\1" v "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
  set(${out_var} ${v} PARENT_SCOPE)
endfunction()
# Everything from the "sample (...):" line on.
function(sample_text out_var text label)
  string(FIND "${text}" "sample (temperature" at)
  if(at LESS 0)
    message(FATAL_ERROR "${label}: no sample in:\n${text}")
  endif()
  string(SUBSTRING "${text}" ${at} -1 s)
  set(${out_var} "${s}" PARENT_SCOPE)
endfunction()
sample_text(ref_sample "${ref}" "the single process")

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
  set(val_report "")
  foreach(step 0 3)
    val_loss(want "${ref}" ${step} "the single process")
    val_loss(got "${out}" ${step} "${label}")
    math(EXPR diff "${got} - ${want}")
    if(diff LESS 0)
      math(EXPR diff "0 - ${diff}")
    endif()
    if((plan STREQUAL "data=1,tensor=1,pipeline=1" AND NOT diff EQUAL 0)
       OR diff GREATER val_tolerance)
      message(FATAL_ERROR "${label}: step ${step} val loss ${got}e-4, the single process "
                          "${want}e-4")
    endif()
    string(APPEND val_report " step ${step} val loss ${got}e-4 (single ${want}e-4)")
  endforeach()
  if(plan STREQUAL "data=1,tensor=1,pipeline=1")
    sample_text(sample "${out}" "${label}")
    if(NOT sample STREQUAL ref_sample)
      message(FATAL_ERROR "${label}: the sample differs from the single process's:\n"
                          "${sample}\n---\n${ref_sample}")
    endif()
  endif()
  message(STATUS "${label}: masters fnv1a ${hash}, largest signature difference ${worst} "
                 "(tolerance ${tolerance});${val_report}")
endforeach()
