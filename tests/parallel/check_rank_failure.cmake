# cmake -D command="mpiexec;-n;2;...;rank_failure;MODE" -D expect="text" -D max_seconds=N
#       [-D expect_not="text"] -P check_rank_failure.cmake
# Passes when the job exits nonzero within max_seconds and its output contains `expect` (and
# not `expect_not`). A job that hangs is killed at 120 s and fails.
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
if(result EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although a rank failed:\n${out}")
endif()
if(took GREATER ${max_seconds})
  message(FATAL_ERROR "the job took ${took} s to end (at most ${max_seconds} s expected; "
                      "result ${result}):\n${out}")
endif()
string(FIND "${out}" "${expect}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the output does not contain \"${expect}\":\n${out}")
endif()
if(DEFINED expect_not)
  string(FIND "${out}" "${expect_not}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "the output contains \"${expect_not}\":\n${out}")
  endif()
endif()
message(STATUS "the job ended in ${took} s with exit status ${result} and the failing rank's "
               "message")
