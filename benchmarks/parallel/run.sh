#!/bin/sh
# Runs every mode of bench_parallel with its process counts and prints the markdown tables.
#   benchmarks/parallel/run.sh [build-dir]     (default: build)
set -eu
build=${1:-build}
bench=$build/benchmarks/parallel/bench_parallel
mpiexec=${MPIEXEC:-mpiexec}
flags="--oversubscribe"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
export OMP_PROC_BIND=false

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores available"
echo
echo "## images per CPU-second, FashionCNN fp32, global batch 128, 1 to 8 processes"
echo
OMP_NUM_THREADS=1 "$bench" throughput
OMP_NUM_THREADS=2 "$bench" throughput | tail -n 1
for n in 2 4 8; do
  OMP_NUM_THREADS=1 $mpiexec $flags -n $n "$bench" throughput | tail -n +3
done
echo
echo "## pipeline bubble, uniform MLP, global batch 512: measured against the schedule's"
echo
OMP_NUM_THREADS=1 $mpiexec $flags -n 2 "$bench" bubble
OMP_NUM_THREADS=1 $mpiexec $flags -n 4 "$bench" bubble | tail -n +3
echo
echo "## communication volume per step"
echo
OMP_NUM_THREADS=1 $mpiexec $flags -n 8 "$bench" volume
echo
echo "## ZeRO memory per rank, measured against the formula"
echo
OMP_NUM_THREADS=1 $mpiexec $flags -n 8 "$bench" zero
