# Runs train_fashion_mnist with bad command lines and checks that each is refused at once with
# exit code 2, the usage line and a message naming what is wrong; then checks that the errors
# found only at run time come before any training:
#  - --checkpoint into a missing directory fails before the first epoch (exit 1, no epoch line);
#  - a checkpoint saved in fp32 is refused by a bf16 --resume, naming the field and both values.
# -D exe=... -D dir=... (a scratch directory)
set(cases
    "--epochs|abc@--epochs 'abc'"
    "--threads|abc@--threads 'abc'"
    "--batch|1e3@--batch '1e3'"
    "--epochs|2x@--epochs '2x'"
    "--lr|inf@--lr 'inf'"
    "--lr|nan@--lr 'nan'"
    "--lr|-0.5@--lr -0.5"
    "--threads|-3@--threads -3: out of range"
    "--limit|-1@--limit -1: out of range"
    "--test-limit|5k@--test-limit '5k'"
    "--seed|-1@--seed '-1'"
    "--precision|fp64@--precision 'fp64'"
    "--plan|data=0@--plan data=0: the data degree must be a whole number in 1..4096"
    "--plan|tensor=3@--plan tensor=3: the tensor degree must be 1, 2 or 4"
    "--plan|pipeline=8@--plan pipeline=8: the pipeline degree must be 1, 2 or 4"
    "--collective-timeout|-1@--collective-timeout -1"
    "--epochs@missing value after --epochs"
    "--bogus@unknown argument '--bogus'")
foreach(c ${cases})
  string(FIND "${c}" "@" eq)
  string(SUBSTRING "${c}" 0 ${eq} args)
  math(EXPR from "${eq} + 1")
  string(SUBSTRING "${c}" ${from} -1 expect)
  string(REPLACE "|" ";" args "${args}")
  execute_process(COMMAND ${exe} --no-progress ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 60)
  string(FIND "${err}" "${expect}" at_msg)
  string(FIND "${err}" "usage: train_fashion_mnist" at_usage)
  if(NOT rc EQUAL 2 OR at_msg EQUAL -1 OR at_usage EQUAL -1 OR NOT out STREQUAL "")
    message(FATAL_ERROR "'${args}': expected exit code 2, \"${expect}\" and the usage line; got "
                        "exit ${rc}\nstdout: ${out}\nstderr: ${err}")
  endif()
endforeach()

set(common --limit 64 --test-limit 100 --batch 32 --no-progress --threads 1)
file(MAKE_DIRECTORY ${dir})
execute_process(COMMAND ${exe} ${common} --checkpoint ${dir}/no/such/dir/ck.bin
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 1 OR NOT err MATCHES "no/such/dir/ck.bin" OR NOT err MATCHES "does not exist"
   OR out MATCHES "epoch")
  message(FATAL_ERROR "--checkpoint into a missing directory was not refused before training "
                      "(exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
endif()
execute_process(COMMAND ${exe} ${common} --checkpoint ${dir} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 1 OR NOT err MATCHES "is a directory" OR out MATCHES "epoch")
  message(FATAL_ERROR "--checkpoint naming a directory was not refused before training "
                      "(exit ${rc}):\nstdout: ${out}\nstderr: ${err}")
endif()

set(ck ${dir}/fp32.ckpt)
file(REMOVE ${ck})
execute_process(COMMAND ${exe} ${common} --precision fp32 --checkpoint ${ck} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fp32 run failed (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${exe} ${common} --precision bf16 --epochs 2 --resume ${ck}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(rc EQUAL 0 OR NOT err MATCHES "fp32.ckpt" OR NOT err MATCHES "run/precision"
   OR NOT err MATCHES "saved 'fp32', expected 'bf16'" OR out MATCHES "epoch 2")
  message(FATAL_ERROR "an fp32 checkpoint resumed in bf16 was not refused clearly (${rc}):\n"
                      "stdout: ${out}\nstderr: ${err}")
endif()
execute_process(COMMAND ${exe} ${common} --resume ${dir} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 300)
if(rc EQUAL 0 OR NOT err MATCHES "is a directory" OR NOT err MATCHES "tessera::train::load")
  message(FATAL_ERROR "--resume of a directory was not refused by tessera (${rc}):\n${err}")
endif()
message(STATUS "every bad command line was refused with the usage line and exit code 2")
