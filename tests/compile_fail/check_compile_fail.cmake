# cmake -D build_dir=... -D target=... -D expected=... [-D config=...] -P check_compile_fail.cmake
# Builds `target` in `build_dir`; succeeds only if the build fails and its output contains
# `expected` (a literal string, not a regular expression).
foreach(var build_dir target expected)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_compile_fail.cmake: -D ${var}=... is required")
  endif()
endforeach()

# config: the configuration to build with multi-configuration generators (optional).
execute_process(COMMAND ${CMAKE_COMMAND} --build ${build_dir} --config "${config}" --target ${target}
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)

if(result EQUAL 0)
  message(FATAL_ERROR "${target} compiled, but it must fail with: ${expected}\n${output}")
endif()
string(FIND "${output}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${target} failed to compile, but without the expected message\n"
                      "  expected: ${expected}\n--- compiler output ---\n${output}")
endif()
message(STATUS "${target} failed to compile, as it must, with: ${expected}")
