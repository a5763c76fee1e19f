#!/usr/bin/env bash
# Builds and runs benchmarks/gemm/bench_gemm (tessera beside OpenBLAS and oneDNN, 1 and 2 threads,
# a few minutes), then plots GFLOP/s against size.
#   scripts/bench_gemm.sh                                    # everything
#   scripts/bench_gemm.sh --benchmark_filter='threads:1/'    # extra arguments go to bench_gemm
# Writes $build/gemm.json (Google Benchmark JSON), $build/gemm_tables.md (the summary tables) and
# docs/gemm.png (scripts/plot_gemm.py; needs python3-matplotlib).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)
build=${TESSERA_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" >/dev/null
cmake --build "$build" -j "${TESSERA_JOBS:-$(nproc)}" --target bench_gemm
OMP_PROC_BIND=${OMP_PROC_BIND:-true} "$build/benchmarks/gemm/bench_gemm" \
  --benchmark_out="$build/gemm.json" --benchmark_out_format=json "$@" | tee "$build/gemm_run.txt"
sed -n '/^Peak measured/,$p' "$build/gemm_run.txt" >"$build/gemm_tables.md"
/usr/bin/python3 "$root/scripts/plot_gemm.py" "$build/gemm.json" "$root/docs/gemm.png"
echo "tables: $build/gemm_tables.md, plot: $root/docs/gemm.png"
