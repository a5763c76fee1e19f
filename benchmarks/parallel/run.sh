#!/bin/sh
# Runs every mode of bench_parallel with its process count and prints the markdown tables.
#   benchmarks/parallel/run.sh [build-dir]     (default: build)
set -eu
build=${1:-build}
bench=$build/benchmarks/parallel/bench_parallel
mpiexec=${MPIEXEC:-mpiexec}
flags="--oversubscribe"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
export OMP_PROC_BIND=false

echo "## images/s, FashionCNN fp32, global batch 128"
echo
OMP_NUM_THREADS=1 "$bench" throughput
OMP_NUM_THREADS=2 "$bench" throughput | tail -n 1
OMP_NUM_THREADS=1 $mpiexec $flags -n 2 "$bench" throughput | tail -n 2
echo
echo "## pipeline=2 bubble, uniform MLP, global batch 512"
echo
OMP_NUM_THREADS=1 $mpiexec $flags -n 2 "$bench" bubble
echo
echo "## communication volume per step"
echo
OMP_NUM_THREADS=1 $mpiexec $flags -n 8 "$bench" volume
echo
echo "## ZeRO memory per rank, measured against the formula"
echo
OMP_NUM_THREADS=1 $mpiexec $flags -n 8 "$bench" zero
