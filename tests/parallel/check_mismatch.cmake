# cmake -D command="mpiexec;-n;3;...;mesh_mismatch" -D ranks=3 -P check_mismatch.cmake
# Passes when the program exits nonzero and every rank printed the plan-size message.
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT 60)
if(result EQUAL 0)
  message(FATAL_ERROR "the job exited 0, but a world of ${ranks} cannot run a plan of 4:\n${out}")
endif()
math(EXPR last "${ranks} - 1")
foreach(r RANGE ${last})
  string(FIND "${out}" "tessera: rank ${r} of ${ranks}: tessera::parallel::mesh: plan(data=2, tensor=1, pipeline=2) needs 4 processes but the world has ${ranks}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "rank ${r} did not print the plan-size message:\n${out}")
  endif()
endforeach()
message(STATUS "every rank explained the mismatch; exit code ${result}")
