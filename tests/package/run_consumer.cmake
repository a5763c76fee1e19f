# Configures, builds and runs one consumer project from scratch (see CMakeLists.txt here).
#   cmake -D source_dir=... -D build_dir=... -D generator=... -D cxx=... -D build_type=...
#         -D kokkos_dir=... [-D install_tree=<tessera build dir> -D prefix=<install prefix>]
#         [-D tessera_source_dir=<tessera source>] -P run_consumer.cmake
foreach(var source_dir build_dir generator cxx build_type kokkos_dir)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D ${var}=... is required")
  endif()
endforeach()

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "consumer ${step} failed (${result}):\n  ${ARGN}\n${out}")
  endif()
  message(STATUS "consumer ${step}: ok\n${out}")
endfunction()

file(REMOVE_RECURSE ${build_dir})
set(configure_args -S ${source_dir} -B ${build_dir} -G ${generator}
                   -DCMAKE_CXX_COMPILER=${cxx} -DCMAKE_BUILD_TYPE=${build_type}
                   -DKokkos_DIR=${kokkos_dir})
if(DEFINED install_tree)
  # A fresh prefix holding only tessera: what `cmake --install` puts there is all it gets.
  file(REMOVE_RECURSE ${prefix})
  run(install ${CMAKE_COMMAND} --install ${install_tree} --prefix ${prefix})
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${prefix}
       -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
endif()
if(DEFINED tessera_source_dir)
  list(APPEND configure_args -DTESSERA_SOURCE_DIR=${tessera_source_dir})
endif()

run(configure ${CMAKE_COMMAND} ${configure_args})
run(build ${CMAKE_COMMAND} --build ${build_dir} --parallel 2)
run(run ${build_dir}/consumer)
