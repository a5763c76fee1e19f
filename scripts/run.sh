#!/usr/bin/env bash
# The main job: bootstraps the dependencies, builds the main example and runs it: training
# FashionCNN on Fashion-MNIST (examples/train_fashion_mnist.cpp).
#   scripts/run.sh                          # fp32, one epoch on 6,000 images (about a minute)
#   scripts/run.sh --precision bf16 --full  # extra arguments go to the example (--help lists them)
#   scripts/run.sh gpt                      # the character GPT on the fortunes corpus
#                                           # (examples/train_char_gpt.cpp), 2000 steps, fp32
#   scripts/run.sh gpt --steps 300 --precision bf16   # its flags follow "gpt"
# Idempotent: a second run only checks the dependencies and the build (a few seconds).
# TESSERA_BUILD_DIR (default build/) and TESSERA_JOBS (default: all cores) as in scripts/test.sh.
set -euo pipefail

# The main example: examples/<name>.cpp, built as the target <name>; "gpt" as the first argument
# picks the character GPT instead.
example=train_fashion_mnist
if [[ ${1:-} == gpt ]]; then
  example=train_char_gpt
  shift
fi

root=$(cd "$(dirname "$0")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)
build=${TESSERA_BUILD_DIR:-$root/build}
jobs=${TESSERA_JOBS:-$(nproc)}

# Configure once, with the same options as scripts/test.sh so both share the build tree; later
# builds re-run CMake by themselves when a CMakeLists.txt changes.
if [[ ! -f $build/CMakeCache.txt ]] ||
  ! grep -qx "Kokkos_ROOT:[A-Z]*=$kokkos" "$build/CMakeCache.txt"; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
    -DTESSERA_BUILD_TESTS=ON >/dev/null
fi
printf '[run] building %s in %s\n' "$example" "$build" >&2
cmake --build "$build" -j "$jobs" --target "$example" >/dev/null
OMP_PROC_BIND=${OMP_PROC_BIND:-false} "$build/examples/$example" "$@"
