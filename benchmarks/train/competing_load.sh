#!/usr/bin/env bash
# images/s of examples/train_fashion_mnist alone and beside one CPU-bound process (a shell busy
# loop: one core's worth of load, the same on every machine), under each way libgomp's idle
# threads can wait. docs/performance.md ("A competing process") has a table from it.
#   benchmarks/train/competing_load.sh [example binary] [example flags, e.g. --precision bf16]
#   THREADS=1 IMAGES=20000 benchmarks/train/competing_load.sh   # defaults: 2 threads, 20000
# Default binary: build/examples/train_fashion_mnist (scripts/run.sh builds it). Name the CPU
# (lscpu) with the figures; compare rows of one sitting only.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
exe=$root/build/examples/train_fashion_mnist
if (($#)) && [[ $1 != -* ]]; then
  exe=$1
  shift
fi
extra=("$@") # the example's own flags
[[ -x $exe ]] || { echo "competing_load.sh: no example at $exe (run scripts/run.sh first)" >&2; exit 2; }
threads=${THREADS:-2}
images=${IMAGES:-20000}
waits=("default:" "spin1k:GOMP_SPINCOUNT=1000" "passive:OMP_WAIT_POLICY=passive"
       "active:OMP_WAIT_POLICY=active")
rate() {
  env OMP_PROC_BIND=false "$@" "$exe" --threads "$threads" --limit "$images" --no-progress \
    "${extra[@]}" 2>&1 | grep -o '[0-9]* images/s' || echo "failed"
}
busy=
trap '[[ -n $busy ]] && kill "$busy" 2>/dev/null' EXIT
lscpu | grep -m1 'Model name' || true
for load in alone busy; do
  if [[ $load == busy ]]; then
    sh -c 'while :; do :; done' &
    busy=$!
    sleep 0.5
  fi
  for w in "${waits[@]}"; do
    name=${w%%:*} setting=${w#*:}
    envs=()
    [[ -n $setting ]] && envs=("$setting")
    printf '%-6s %-8s threads %s: %s, %s\n' "$load" "$name" "$threads" "$(rate "${envs[@]}")" \
      "$(rate "${envs[@]}")"
  done
done
