#!/usr/bin/env bash
# Builds tessera's tests and runs them with CTest, bootstrapping dependencies first.
#   scripts/test.sh                 # everything (the exhaustive conversion tests included)
#   scripts/test.sh -L precision    # extra arguments go to ctest
# ccache (installed by the bootstrap) keeps rebuilds of unchanged programs cheap; CCACHE_BASEDIR
# makes its hits independent of where the checkout lives.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)
build=${TESSERA_BUILD_DIR:-$root/build}
jobs=${TESSERA_JOBS:-$(nproc)}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
generator=() # Ninja for a new build folder (an existing one keeps its generator)
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DTESSERA_BUILD_TESTS=ON "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs"
cd "$build"
# CTest runs two programs at a time on two cores, most of them OpenMP with a thread per core.
# OMP_WAIT_POLICY=passive: a thread that waits (at a parallel region's end) sleeps instead of
# spinning, so the two programs' threads do not burn each other's time slices. Spinning, tests
# of 0.1-1.6 s took 27-96 s each and CTest 575 s; passive, 187 s (AMD Zen 5, 2 cores, same
# binaries, one sitting: benchmarks/compile/README.md).
export OMP_PROC_BIND=${OMP_PROC_BIND:-false} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --output-on-failure -j "$jobs" "$@"
