#!/usr/bin/env bash
# Per-TU compile time of a CMake build (issue 16): a compiler launcher that runs the compile
# under GNU time and appends "CPU-seconds wall-seconds maxRSS-KiB object" to $TU_TIME_LOG.
#
#   cmake -S . -B build-t -DCMAKE_CXX_COMPILER_LAUNCHER=$PWD/benchmarks/compile/tu_time.sh ...
#   TU_TIME_LOG=$PWD/tu.log cmake --build build-t --target test_conv2d -j 2
#   benchmarks/compile/tu_time.sh --table tu.log     # Markdown table, slowest first
#
# CPU seconds (user + system) are the figure to compare on a shared machine; wall seconds grow
# with the load. No ccache here: every compile is a real one. Link steps are not launched
# through CMAKE_CXX_COMPILER_LAUNCHER, so only objects are listed.
set -uo pipefail
if [[ ${1:-} == --table ]]; then
  echo "| object | CPU s | wall s | max RSS MiB |"
  echo "|---|---:|---:|---:|"
  sort -gr "$2" | awk '{printf "| %s | %.1f | %.1f | %.0f |\n", $4, $1, $2, $3 / 1024; t += $1}
                       END {printf "| total (%d objects) | %.1f | | |\n", NR, t}'
  exit 0
fi
log=${TU_TIME_LOG:-/dev/null}
obj=?
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [[ ${args[i]} == -o ]] && obj=${args[i + 1]}
done
tf=$(mktemp)
/usr/bin/time -f '%U %S %e %M' -o "$tf" "$@"
rc=$?
# GNU time puts "Command exited with non-zero status N" before the format's line.
read -r u s e m < <(tail -n 1 "$tf")
rm -f "$tf"
((rc == 0)) || exit $rc # a failed compile is not a measurement
printf '%s %s %s %s\n' "$(awk -v u="$u" -v s="$s" 'BEGIN {print u + s}')" "$e" "$m" \
  "${obj#*CMakeFiles/}" >>"$log"
exit $rc
