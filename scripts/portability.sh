#!/usr/bin/env bash
# tessera beyond the default build: Kokkos 4.6 (OpenMP + Serial, and Threads + Serial), clang 14,
# and a HIP (AMD GPU) compile. Kokkos builds are made once and cached by scripts/bootstrap.sh.
#
#   scripts/portability.sh quick   # CI: one test program per module (and the examples)
#   scripts/portability.sh full    # everything: the whole suite on 4.6 OpenMP and on Threads,
#                                  # the clang build of every test, the HIP compile of every
#                                  # test and example
#   scripts/portability.sh quick k46 threads   # only the named parts (k46 threads clang hip)
#
# Parts:
#   k46      Kokkos 4.6.01 OpenMP + Serial: build and run (quick: one program per module)
#   threads  Kokkos 4.6.01 Threads + Serial: build and run (quick: one program per module)
#   clang    clang++-14 against Kokkos 3.4.1, -Werror: build (quick: the examples and one
#            program per module) and run the test programs built
#   hip      hipcc against Kokkos 4.6.01 HIP (gfx90a): compile only, nothing can run without
#            the GPU (quick: the examples and one program per module), so at -O1 throughout:
#            every template is instantiated and every kernel compiled for the device as at -O3
#            (what the part proves), for less compile time
# quick compiles the examples, which clang and hip only build, with a reduced instantiation set
# (-DTESSERA_EXAMPLES_REDUCED=ON: every precision, plan degrees 1 and 2, train_char_gpt's
# default size; examples/example_instances.hpp) at -O1 (TESSERA_EXAMPLES_COMPILE_OPTIONS): the
# proof that they compile warning-free costs a fraction of the full set at -O3 (issue 16,
# benchmarks/compile/README.md). full compiles the whole set at -O3 (the hip
# part: at -O1, as above).
# Build folders: $TESSERA_PORTABILITY_DIR (default build-portability/), one per part.
# Prints each part's wall time and a summary; exits non-zero if any part failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-quick}
shift || true
parts=("$@")
((${#parts[@]})) || parts=(k46 threads clang hip)
[[ $mode == quick || $mode == full ]] || { echo "usage: $0 [quick|full] [part...]" >&2; exit 2; }
out=${TESSERA_PORTABILITY_DIR:-$root/build-portability}
jobs=${TESSERA_JOBS:-$(nproc)}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# ccache hits independent of where the checkout lives (read at compile time: exported).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
mkdir -p "$out"

# One test program per module (tests/<module>/), the representative subset.
representative=(test_precision test_tensor test_gemm_scaled test_conv2d test_nn_layers
                test_train_optimizers test_parallel_single_process)
examples=(gemm conv tour train_fashion_mnist train_char_gpt)

# The examples' options (see above); full sets them back in a build folder quick configured.
example_opts=(-DTESSERA_EXAMPLES_REDUCED=OFF -DTESSERA_EXAMPLES_COMPILE_OPTIONS=)
[[ $mode == quick ]] &&
  example_opts=(-DTESSERA_EXAMPLES_REDUCED=ON -DTESSERA_EXAMPLES_COMPILE_OPTIONS=-O1)

summary=()
failed=0
note() { printf '[portability] %s\n' "$*" >&2; }

# configure <dir> <kokkos prefix> [cmake args...]
configure() {
  local dir=$1 kokkos=$2
  shift 2
  # Ninja for a new folder: CMake's Makefiles build the targets named on one command line one
  # after the other, and most are one source file, so a quick part used one core of two.
  local generator=()
  [[ ! -f $dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$root" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DKokkos_ROOT="$kokkos" -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=OFF \
    "${launcher[@]}" "$@" \
    >"$dir.configure.log" 2>&1 || { tail -n 30 "$dir.configure.log" >&2; return 1; }
}

# keep_going <dir>: the build tool's keep-going flag (Ninja's "-k 0": no limit on failures).
keep_going() { if [[ -f $1/build.ninja ]]; then echo "-k 0"; else echo "-k"; fi; }

# build <dir> [targets...] (no targets: all)
build() {
  local dir=$1
  shift
  if (($#)); then
    cmake --build "$dir" -j "$jobs" --target "$@" >"$dir.build.log" 2>&1
  else
    # Everything (full): keep going past a failing target, so the log lists every failure.
    cmake --build "$dir" -j "$jobs" -- $(keep_going "$dir") >"$dir.build.log" 2>&1
  fi || { grep -E 'error|Error' "$dir.build.log" | head -n 40 >&2; return 1; }
}

# run_programs <dir> <program...>: runs each test program; prints Catch2's summary lines.
run_programs() {
  local dir=$1 p exe rc=0
  shift
  for p in "$@"; do
    exe=$(find "$dir/tests" -type f -name "$p" -perm -u+x | head -n 1)
    [[ -n $exe ]] || { note "$p was not built"; rc=1; continue; }
    if OMP_PROC_BIND=false "$exe" --use-colour no >"$dir.$p.log" 2>&1; then
      printf '  %-32s %s\n' "$p" "$(grep -E '^(All tests passed|test cases:)' "$dir.$p.log" | tail -n 1)" >&2
    else
      printf '  %-32s FAILED (%s)\n' "$p" "$dir.$p.log" >&2
      rc=1
    fi
  done
  return $rc
}

# build_and_test <dir> [extra quick targets...]: quick builds the representative programs (and
# the extra targets) and runs the programs; full builds everything and runs CTest.
build_and_test() {
  local dir=$1
  shift
  if [[ $mode == quick ]]; then
    build "$dir" "$@" "${representative[@]}" && run_programs "$dir" "${representative[@]}"
  else
    local rc=0
    build "$dir" || rc=1
    (cd "$dir" && OMP_PROC_BIND=false OMP_WAIT_POLICY=passive ctest -j "$jobs" --output-on-failure \
      >"$dir.ctest.log" 2>&1) || rc=1
    grep -E 'tests passed|tests failed' "$dir.ctest.log" >&2
    return $rc
  fi
}

run_part() {
  local part=$1 dir kokkos rc=0
  dir=$out/$part
  case $part in
    k46 | threads)
      local variant=kokkos-4.6-openmp
      [[ $part == threads ]] && variant=kokkos-4.6-threads
      kokkos=$("$root/scripts/bootstrap.sh" "$variant" | tail -n 1) || return 1
      configure "$dir" "$kokkos" || return 1
      build_and_test "$dir" || rc=1
      ;;
    clang)
      kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1) || return 1
      CXX=clang++-14 configure "$dir" "$kokkos" -DCMAKE_CXX_COMPILER=clang++-14 \
        -DCMAKE_CXX_FLAGS=-Werror "${example_opts[@]}" || return 1
      build_and_test "$dir" "${examples[@]}" || rc=1
      ;;
    hip)
      kokkos=$("$root/scripts/bootstrap.sh" kokkos-4.6-hip | tail -n 1) || return 1
      # Host code for any x86-64 (no -march=native), device code for gfx90a (from Kokkos).
      configure "$dir" "$kokkos" -DCMAKE_CXX_COMPILER=hipcc -DTESSERA_NATIVE=OFF \
        "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DTESSERA_TESTS_COMPILE_OPTIONS= \
        "${example_opts[@]}" || return 1
      local targets=()
      if [[ $mode == quick ]]; then
        targets=("${examples[@]}" "${representative[@]}")
      else
        # Every test program and example (CMake's list of targets, whatever the generator).
        mapfile -t targets < <(sed -n 's#.*/\(test_[a-z0-9_]*\|fuzz_replay_[a-z0-9_]*\|gemm\|conv\|tour\|train_fashion_mnist\|train_char_gpt\)\.dir$#\1#p' "$dir/CMakeFiles/TargetDirectories.txt")
      fi
      local t ok=0 bad=()
      # One target at a time (-k): every failure is listed, not just the first.
      cmake --build "$dir" -j "$jobs" --target "${targets[@]}" -- $(keep_going "$dir") \
        >"$dir.build.log" 2>&1 || true
      for t in "${targets[@]}"; do
        if [[ -n $(find "$dir" -type f -name "$t" -perm -u+x | head -n 1) ]]; then
          ok=$((ok + 1))
        else
          bad+=("$t")
        fi
      done
      note "hip: ${ok}/${#targets[@]} targets compiled${bad[*]:+; failed: ${bad[*]}}"
      ((${#bad[@]} == 0)) || { grep -E 'error' "$dir.build.log" | head -n 40 >&2; rc=1; }
      ;;
    *)
      note "unknown part $part"
      return 2
      ;;
  esac
  return $rc
}

for part in "${parts[@]}"; do
  note "--- $part ($mode)"
  start=$(date +%s)
  if run_part "$part"; then status=ok; else status=FAILED failed=1; fi
  summary+=("$part ($mode): $status, $(($(date +%s) - start)) s")
done
note "summary:"
for s in "${summary[@]}"; do note "  $s"; done
exit $failed
