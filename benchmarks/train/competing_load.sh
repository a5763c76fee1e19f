#!/usr/bin/env bash
# images/s of examples/train_fashion_mnist alone and beside one CPU-bound process (a shell busy
# loop: one core's worth of load, the same on every machine): with the team governor on (the
# example's default, train/team.hpp) and off (--fixed-team) under each way libgomp's idle threads
# can wait. docs/performance.md ("A competing process") has tables from it.
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
# name:environment:flag. "governor": the example as it ships; the others keep the whole team.
waits=("governor::" "default::--fixed-team" "spin1k:GOMP_SPINCOUNT=1000:--fixed-team"
       "passive:OMP_WAIT_POLICY=passive:--fixed-team" "active:OMP_WAIT_POLICY=active:--fixed-team")
rate() { # rate ENV FLAG
  local envs=() flags=()
  [[ -n $1 ]] && envs=("$1")
  [[ -n $2 ]] && flags=("$2")
  env OMP_PROC_BIND=false "${envs[@]}" "$exe" --threads "$threads" --limit "$images" \
    --no-progress "${flags[@]}" "${extra[@]}" 2>&1 | grep -o '[0-9]* images/s' || echo "failed"
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
    IFS=: read -r name setting flag <<<"$w"
    printf '%-6s %-8s threads %s: %s, %s\n' "$load" "$name" "$threads" \
      "$(rate "$setting" "$flag")" "$(rate "$setting" "$flag")"
  done
done
