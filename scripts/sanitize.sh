#!/usr/bin/env bash
# Builds the tests that exercise tessera's public checks (argument checks of gemm and conv2d,
# shapes and views, the IDX reader, checkpoints, optimizers, and the fuzz targets' replay of
# their corpora) with AddressSanitizer + UndefinedBehaviorSanitizer (g++, -O1 -g1) in
# build-asan/, and runs them with CTest. Any sanitizer report fails the test that produced it.
#   scripts/sanitize.sh                       # the subset below
#   scripts/sanitize.sh -R checkpoint         # extra arguments go to ctest
#   TESSERA_SANITIZE_TARGETS="test_nn_idx" scripts/sanitize.sh
# Measured with a fresh build-asan (ccache holding no usable entry) on 2 cores shared with other
# builds (load about 10): build 756 s, tests 116 s (115 tests), 872 s in all, using 377 s of CPU
# (on 2 idle cores some 3 to 4 minutes: an estimate, not measured). No sanitizer report and no
# suppression needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kokkos=${Kokkos_ROOT:-$("$root/scripts/bootstrap.sh" | tail -n 1)}
build=${TESSERA_ASAN_BUILD_DIR:-$root/build-asan}
jobs=${TESSERA_JOBS:-$(nproc)}
# Chosen for what they check (every public argument check, the file readers) against their
# build time; the numeric kernels' accuracy tests are left to the normal build.
targets=${TESSERA_SANITIZE_TARGETS:-"test_gemm_errors test_conv2d_checks test_tensor test_nn_idx
  test_train_checkpoint test_train_optimizers fuzz_replay_idx fuzz_replay_checkpoint
  fuzz_replay_flags fuzz_replay_conv_gemm"}

# ccache: hits independent of where the checkout lives (CCACHE_BASEDIR, read at compile time, so
# exported for the build; NOHASHDIR: these -g builds would otherwise hash the build folder's path).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# Ninja builds the programs side by side; CMake's Makefiles build the targets named on one
# command line one after the other (most are a single source file: no parallelism at all).
generator=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
start=$(date +%s)
cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_CXX_COMPILER=g++ \
  -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DKokkos_ROOT="$kokkos" \
  -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=OFF -DTESSERA_BUILD_EXAMPLES=OFF \
  -DTESSERA_SANITIZE=address,undefined "${launcher[@]}" >/dev/null
existing=()
for t in $targets; do
  # A target another branch has not brought yet (fuzz_replay_flags needs the example's parser).
  if grep -q "/$t\.dir\$" "$build/CMakeFiles/TargetDirectories.txt"; then existing+=("$t"); else
    echo "sanitize.sh: no target $t in this tree, skipped" >&2
  fi
done
cmake --build "$build" -j "$jobs" --target "${existing[@]}"
built=$(date +%s)

# ASan: stop at the first error; leak checking on (Kokkos 3.4 and libgomp free what they
# allocate at Kokkos::finalize / exit: no leak suppression is needed). UBSan: print the stack
# and stop. OMP_PROC_BIND=false: helpers share the machine's cores; OMP_WAIT_POLICY=passive:
# CTest runs two OpenMP programs at once (scripts/test.sh).
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export OMP_PROC_BIND=${OMP_PROC_BIND:-false} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd "$build"
# Only the programs built above: Catch2 adds a *_NOT_BUILT test for each program not built,
# and the compile_fail, headers and package tests configure and build projects of their own.
status=0
ctest --output-on-failure -j "$jobs" \
  -E '_NOT_BUILT|^compile_fail\.|^headers_compile_alone$|^package\.|^parallel\.|^example\.' \
  "$@" || status=$?
end=$(date +%s)
echo "sanitize.sh: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
exit $status
