#!/usr/bin/env bash
# Compile-time benchmark (STYLE.md habit 11: compile time tracked like run time).
#
#   benchmarks/compile/measure.sh [--runs N] [--program-runs M] [--repo DIR] [--out FILE]
#
# Compiles, each alone and N times (default 3; the median is reported; the two programs M
# times, default N: on a loaded machine train_small alone can take minutes), with the flags tessera's
# own programs get from CMake (Release, -Wall -Wextra -march=native, -fopenmp from Kokkos):
#   - a TU that includes only <Kokkos_Core.hpp>     (the floor every header pays)
#   - <Eigen/Core>, the anchor, when Eigen is installed (skipped with a note otherwise)
#   - one TU per entry header include/tessera/*.hpp
#   - benchmarks/compile/gemm_shapes.cpp (fp32 gemm of 4 static shapes and 1 dynamic)
#   - benchmarks/compile/train_small.cpp  (FashionCNN fp32, SGD, 2 steps)
# and prints a Markdown table of wall seconds, CPU seconds (user + system: less sensitive to a
# loaded machine than wall time) and maximum resident set size (MiB) from /usr/bin/time -v.
# Then it counts the GEMM code in the two programs' objects (nm -C, defined functions): every
# function of namespace tessera::detail whose name contains "gemm" (the drivers, checks and
# kernels of gemm/detail/) or lies in tessera::detail::hostgemm, and, for gemm_shapes, how many
# of those mention each static shape of A (with the operands normalised before the algorithm
# is chosen, only the small per-operand adapters to_gemm_operand and as_gemm_matrix_operand
# remain per shape; the checks, the driver and the kernels do not). Counted at -O3 (what is
# emitted; both programs) and at -O1 -fno-inline (every function instantiated, nothing inlined
# away; gemm_shapes only; -O0 is not usable: xsimd's AVX512BW code does not compile without
# __OPTIMIZE__ on GCC 12).
#
# --repo DIR measures another checkout with this script and these TUs (e.g. a worktree of the
# base commit: git worktree add /tmp/base <commit>; measure.sh --repo /tmp/base), so "before"
# and "after" come from one sitting. The machine may be shared: compare medians, not single runs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
runs=3
program_runs=
out=/dev/stdout
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --program-runs) program_runs=$2; shift 2 ;;
    --repo) repo=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--program-runs M] [--repo DIR] [--out FILE]" >&2; exit 2 ;;
  esac
done
program_runs=${program_runs:-$runs}
kokkos=${Kokkos_ROOT:-/root/.cache/tessera/kokkos-3.4.1-openmp}
cxx=${CXX:-/usr/bin/c++}
[[ -x /usr/bin/time ]] || { echo "measure.sh: needs /usr/bin/time (GNU time)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-DBOOST_ALL_NO_LIB -DKOKKOS_DEPENDENCE -I"$repo/include" -isystem "$kokkos/include"
       -DNDEBUG -fopenmp -Wall -Wextra -march=native -std=gnu++20)

# name|source
items=()
printf '#include <Kokkos_Core.hpp>\n' >"$work/kokkos_core.cpp"
items+=("<Kokkos_Core.hpp> (floor)|$work/kokkos_core.cpp")
if [[ -f /usr/include/eigen3/Eigen/Core ]]; then
  printf '#include <Eigen/Core>\n' >"$work/eigen_core.cpp"
  items+=("<Eigen/Core> (anchor)|$work/eigen_core.cpp")
  flags+=(-isystem /usr/include/eigen3)
else
  echo "measure.sh: Eigen is not installed: no <Eigen/Core> anchor" >&2
fi
for h in "$repo"/include/tessera/*.hpp; do
  n=$(basename "$h")
  printf '#include <tessera/%s>\n' "$n" >"$work/h_${n%.hpp}.cpp"
  items+=("tessera/$n|$work/h_${n%.hpp}.cpp")
done
items+=("gemm_shapes.cpp|$here/gemm_shapes.cpp" "train_small.cpp|$here/train_small.cpp")
programs="gemm_shapes.cpp train_small.cpp"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# wall seconds and max RSS KiB of one compile; the object is kept as $3
measure_one() {
  local src=$1 obj=$2 log=$work/time.log
  /usr/bin/time -v "$cxx" "${flags[@]}" -O3 -c "$src" -o "$obj" 2>"$log" >/dev/null ||
    { cat "$log" >&2; echo "measure.sh: $src did not compile" >&2; exit 1; }
  local wall cpu rss
  cpu=$(awk -F': ' '/User time/ {u=$2} /System time/ {s=$2} END {print u+s}' "$log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,t,":"); s=0; for(i=1;i<=n;i++) s=s*60+t[i]; print s}' "$log")
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  echo "$wall $cpu $rss"
}

{
  echo "Compile time, $repo ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')), median of $runs (programs: $program_runs), $("$cxx" --version | head -1)"
  echo
  echo "| TU | wall s | CPU s | max RSS MiB |"
  echo "|---|---:|---:|---:|"
} >>"$out"
for it in "${items[@]}"; do
  name=${it%%|*}
  src=${it#*|}
  : >"$work/w"
  : >"$work/r"
  : >"$work/c"
  n=$runs
  [[ " $programs " == *" $name "* ]] && n=$program_runs
  for ((r = 0; r < n; ++r)); do
    read -r w c k < <(measure_one "$src" "$work/$(basename "$src" .cpp).o")
    echo "$w" >>"$work/w"
    echo "$c" >>"$work/c"
    echo "$k" >>"$work/r"
  done
  printf '| %s | %.2f | %.2f | %.0f |\n' "$name" "$(median <"$work/w")" "$(median <"$work/c")" \
    "$(($(median <"$work/r") / 1024))" >>"$out"
done

# GEMM functions in an object: defined functions of tessera::detail that are GEMM code.
gemm_functions() {
  nm -C --defined-only "$1" | awk '$2 ~ /^[TtWw]$/' | cut -d' ' -f3- |
    grep -E '^(float|void|auto|bool|tessera::|[a-z_:<>, ]+ )?tessera::detail::(hostgemm::|[a-z_]*gemm[a-z_]*[<(])' |
    sort -u
}
{
  echo
  echo "GEMM functions emitted (nm -C: defined functions of tessera::detail named *gemm* or in hostgemm)"
  echo
  echo "| TU | -O3 | -O1 -fno-inline | of those, mentioning each static shape of A |"
  echo "|---|---:|---:|---|"
} >>"$out"
for tu in gemm_shapes train_small; do
  # -O3: the object of the timed compiles. Without inlining: gemm_shapes only (train_small
  # would take as long again; its -O3 count is the one the lead asked for).
  n3=$(gemm_functions "$work/$tu.o" | wc -l)
  n0="-"
  per=""
  if [[ $tu == gemm_shapes ]]; then
    "$cxx" "${flags[@]}" -O1 -fno-inline -c "$here/$tu.cpp" -o "$work/$tu.o0.o"
    gemm_functions "$work/$tu.o0.o" >"$work/$tu.o0.txt"
    n0=$(wc -l <"$work/$tu.o0.txt")
    for s in "8l, 16l" "64l, 64l" "128l, 3136l" "100l, 200l"; do
      per+="($s): $(grep -cF "extents<$s>" "$work/$tu.o0.txt" || true); "
    done
  fi
  echo "| $tu.cpp | $n3 | $n0 | ${per:--} |" >>"$out"
done
