#!/usr/bin/env bash
# Builds tessera's libFuzzer targets (tests/fuzz/fuzz_*.cpp) with clang++-14
# (-fsanitize=fuzzer,address,undefined) in build-fuzz/ and runs each for a bounded time,
# starting from its seed corpus tests/fuzz/corpus/<target>/. Prints executions, time and corpus
# size per target; fails if any target crashes (the input is saved under
# build-fuzz/artifacts/<target>/: add it to tests/fuzz/corpus/<target>/ once fixed, so that the
# replay test in CTest keeps it fixed, or to tests/fuzz/findings/<target>/ until then).
#   scripts/fuzz.sh                          # every target, 30 s each
#   FUZZ_SECONDS=300 scripts/fuzz.sh idx     # one target, longer
# Environment: FUZZ_SECONDS (30), FUZZ_RSS_MB (2048, -rss_limit_mb), FUZZ_TIMEOUT (10 s per input,
# -timeout), TESSERA_FUZZ_CXX (clang++-14), TESSERA_FUZZ_BUILD_DIR (build-fuzz), TESSERA_JOBS.
# New inputs found go to build-fuzz/corpus/<target>/ (not committed; `-merge=1` them into the
# seed corpus if they add coverage worth keeping).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kokkos=${Kokkos_ROOT:-$("$root/scripts/bootstrap.sh" | tail -n 1)}
build=${TESSERA_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${TESSERA_FUZZ_CXX:-clang++-14}
jobs=${TESSERA_JOBS:-$(nproc)}
seconds=${FUZZ_SECONDS:-30}
rss=${FUZZ_RSS_MB:-2048}
per_input=${FUZZ_TIMEOUT:-10}
if (($#)); then targets=("$@"); else targets=(idx checkpoint conv_gemm flags); fi

# ccache: hits independent of where the checkout lives (CCACHE_BASEDIR, read at compile time, so
# exported for the build; NOHASHDIR: these -g builds would otherwise hash the build folder's path).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
generator=() # Ninja builds the targets side by side (see scripts/sanitize.sh)
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g" -DKokkos_ROOT="$kokkos" \
  -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=OFF -DTESSERA_BUILD_EXAMPLES=OFF \
  -DTESSERA_FUZZ=ON "${launcher[@]}" >/dev/null
present=()
for t in "${targets[@]}"; do
  # fuzz_flags exists only where the example's parser header does.
  if grep -q "/fuzz_$t\.dir\$" "$build/CMakeFiles/TargetDirectories.txt"; then present+=("$t"); else
    echo "fuzz.sh: no target fuzz_$t in this tree, skipped" >&2
  fi
done
start=$(date +%s)
cmake --build "$build" -j "$jobs" --target "${present[@]/#/fuzz_}"
echo "fuzz.sh: build $(($(date +%s) - start)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
failed=()
printf '%-12s %10s %8s %8s %s\n' target executions seconds corpus result
for t in "${present[@]}"; do
  exe=$(find "$build" -type f -name "fuzz_$t" -perm -u+x | head -n 1)
  work=$build/corpus/$t
  art=$build/artifacts/$t
  log=$build/fuzz_$t.log
  mkdir -p "$work" "$art"
  dict=()
  if [[ -f $root/tests/fuzz/$t.dict ]]; then dict=(-dict="$root/tests/fuzz/$t.dict"); fi
  t0=$(date +%s)
  rc=0
  "$exe" -max_total_time="$seconds" -rss_limit_mb="$rss" -timeout="$per_input" \
    -print_final_stats=1 -artifact_prefix="$art/" "${dict[@]}" "$work" \
    "$root/tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  t1=$(date +%s)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  corpus=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -n 1 | sed 's/corp: //')
  result=ok
  if ((rc != 0)); then
    result="CRASH (exit $rc; $log, $(ls "$art" | head -n 1))"
    failed+=("$t")
  fi
  printf '%-12s %10s %8s %8s %s\n' "$t" "${runs:-?}" "$((t1 - t0))" "${corpus:-?}" "$result"
done
if ((${#failed[@]})); then
  echo "fuzz.sh: crashes in: ${failed[*]}" >&2
  exit 1
fi
