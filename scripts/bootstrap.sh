#!/usr/bin/env bash
# Installs what tessera's build, tests, benchmarks and examples need on a Debian bookworm
# machine. Idempotent: a second run only checks, and takes a second or two.
#
#   scripts/bootstrap.sh            # packages + Kokkos (OpenMP + Serial) into the cache prefix
#   scripts/bootstrap.sh kokkos-4.6-openmp    # Kokkos 4.6.01, OpenMP + Serial
#   scripts/bootstrap.sh kokkos-4.6-threads   # Kokkos 4.6.01, Threads (std::thread) + Serial
#   scripts/bootstrap.sh kokkos-4.6-hip       # Kokkos 4.6.01, HIP for gfx90a (+ Serial), hipcc
#   TESSERA_SKIP_APT=1 ...          # do not touch Debian packages (machines without root)
#
# The Kokkos 4.6 builds are made on demand from kokkos-4.6.01.tar.gz (checked against its
# SHA-256), found in $TESSERA_DEPS or in a shared/deps folder beside the repository or above it;
# each is cached under the cache prefix like the 3.4.1 one. The kokkos-4.6-hip variant also
# installs ROCm's HIP compiler (about 90 MiB to download, 480 MiB installed).
#
# Prints the Kokkos prefix on its last line, so callers can do
#   KOKKOS_PREFIX=$(scripts/bootstrap.sh | tail -n 1)
set -euo pipefail

variant=${1:-kokkos-3.4.1-openmp}
case $variant in
  kokkos-3.4.1-openmp | kokkos-4.6-openmp | kokkos-4.6-threads | kokkos-4.6-hip) ;;
  *) echo "bootstrap.sh: unknown variant '$variant' (kokkos-3.4.1-openmp, kokkos-4.6-openmp," \
       "kokkos-4.6-threads, kokkos-4.6-hip)" >&2; exit 2 ;;
esac

cache=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
kokkos_prefix=${TESSERA_KOKKOS_PREFIX:-$cache/kokkos-3.4.1-openmp}
mkdir -p "$cache"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# build_kokkos <source> <build dir> <install prefix> <log name> [cmake options...]: a Release,
# C++17, shared-library Kokkos without its tests, installed into the prefix; the build folder is
# removed afterwards, the logs stay in the cache as <log name>-configure.log / -build.log.
build_kokkos() {
  local src=$1 build=$2 prefix=$3 name=$4
  shift 4
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=ON -DKokkos_ENABLE_TESTS=OFF \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON "$@" >"$cache/$name-configure.log" 2>&1 ||
    { cat "$cache/$name-configure.log" >&2; exit 1; }
  cmake --build "$build" -j "${TESSERA_JOBS:-$(nproc)}" >"$cache/$name-build.log" 2>&1 ||
    { tail -n 50 "$cache/$name-build.log" >&2; exit 1; }
  cmake --install "$build" >/dev/null
  rm -rf "$build"
}

# Writes into $1/sources.list and $1/sources.list.d/ a deb-src entry for every deb entry of this
# machine's release suite (VERSION_CODENAME), from its own sources (one-line *.list files and
# deb822 *.sources files), so that the source package comes from the mirror or proxy the
# machine is configured for. Other suites and third-party archives (which often have no
# sources) are left out.
derive_deb_src() {
  local out=$1 codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || { log "no VERSION_CODENAME in /etc/os-release"; exit 1; }
  local lists=() deb822=() f
  [[ -f /etc/apt/sources.list ]] && lists+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list; do [[ -f $f ]] && lists+=("$f"); done
  for f in /etc/apt/sources.list.d/*.sources; do [[ -f $f ]] && deb822+=("$f"); done
  : >"$out/sources.list"
  rm -f "$out/sources.list.d/"*
  # One-line format: "deb [options] URI suite component...".
  if ((${#lists[@]})); then
    awk -v suite="$codename" '
      $1 == "deb" {
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) == suite) { $1 = "deb-src"; print }
      }' "${lists[@]}" >>"$out/sources.list"
  fi
  # deb822 format: stanzas of "Field: value" (continuation lines start with a space).
  if ((${#deb822[@]})); then
    awk -v suite="$codename" '
      function flush(   i, n, words, keep) {
        if (nf == 0) return
        n = split(types, words, /[ \t]+/)
        keep = 0
        for (i = 1; i <= n; i++) if (words[i] == "deb") keep = 1
        n = split(suites, words, /[ \t]+/)
        has = 0
        for (i = 1; i <= n; i++) if (words[i] == suite) has = 1
        if (keep && has && tolower(enabled) != "no") {
          print "Types: deb-src"
          print "Suites: " suite
          for (i = 1; i <= nf; i++) print field[i]
          print ""
        }
        nf = 0; types = ""; suites = ""; enabled = ""
      }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { if (skip == 0) field[nf] = field[nf] "\n" $0; next }
      {
        key = tolower(substr($0, 1, index($0, ":") - 1))
        val = substr($0, index($0, ":") + 1); sub(/^[ \t]+/, "", val)
        skip = 0
        if (key == "types") { types = val; skip = 1 }
        else if (key == "suites") { suites = val; skip = 1 }
        else { if (key == "enabled") enabled = val; field[++nf] = $0 }
      }
      END { flush() }' "${deb822[@]}" >"$out/sources.list.d/derived.sources"
  fi
  if ! grep -qs '^deb-src\|^Types: deb-src' "$out/sources.list" "$out/sources.list.d/derived.sources"; then
    log "no deb entry for suite $codename in /etc/apt/sources.list{,.d/*}: cannot fetch trilinos"
    exit 1
  fi
}

# --- Debian packages -------------------------------------------------------------------------
packages=(
  build-essential cmake pkg-config dpkg-dev
  libboost-dev libxsimd-dev xtl-dev catch2 libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev libdnnl-dev
  dataset-fashion-mnist zlib1g-dev
  fortunes # the character GPT's corpus (/usr/share/games/fortunes, examples/train_char_gpt)
  clang-format
  clang-14 libclang-rt-14-dev ccache ninja-build
)
# ROCm's HIP compiler, only for the HIP build (large: about 90 MiB to download, 480 MiB installed).
[[ $variant == kokkos-4.6-hip ]] && packages+=(hipcc libamdhip64-dev rocm-device-libs)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ -n ${TESSERA_SKIP_APT:-} ]]; then
    log "missing packages (TESSERA_SKIP_APT set, not installing): ${missing[*]}"
  else
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    log "installing: ${missing[*]}"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >"$cache/apt-install.log" 2>&1 || { cat "$cache/apt-install.log" >&2; exit 1; }
  fi
fi

# --- Kokkos 4.6.01 from the pinned source tarball ------------------------------------------------
if [[ $variant == kokkos-4.6-* ]]; then
  kokkos4_sha256=d8a8a5e15331c46b900d3f75d2b62b0b32f067b126a4a75d465224c899765084
  prefix=$cache/$variant
  if [[ ! -f $prefix/lib/cmake/Kokkos/KokkosConfig.cmake ]]; then
    tarball=""
    for d in ${TESSERA_DEPS:-} "$(cd "$(dirname "$0")/.." && pwd)"/{..,../..,../../..}/shared/deps; do
      [[ -n $d && -f $d/kokkos-4.6.01.tar.gz ]] && { tarball=$d/kokkos-4.6.01.tar.gz; break; }
    done
    [[ -n $tarball ]] || { log "kokkos-4.6.01.tar.gz not found: set TESSERA_DEPS to its folder"; exit 1; }
    echo "$kokkos4_sha256  $tarball" | sha256sum -c --quiet - >&2 ||
      { log "$tarball: SHA-256 mismatch"; exit 1; }
    src=$cache/kokkos-4.6.01-src
    if [[ ! -f $src/CMakeLists.txt ]]; then
      rm -rf "$src" && mkdir -p "$src"
      tar -xzf "$tarball" -C "$src" --strip-components=1
    fi
    opts=(-DKokkos_ENABLE_SERIAL=ON)
    case $variant in
      kokkos-4.6-openmp) opts+=(-DKokkos_ENABLE_OPENMP=ON) ;;
      kokkos-4.6-threads) opts+=(-DKokkos_ENABLE_THREADS=ON) ;;
      # Debian's hipcc (ROCm 5.2.3, clang 15) with libstdc++ 12 crashes on <regex> in C++20
      # (fixed in clang 17), so Kokkos is built as C++17; rocThrust is not packaged.
      kokkos-4.6-hip) opts+=(-DCMAKE_CXX_COMPILER=hipcc -DKokkos_ENABLE_HIP=ON
                             -DKokkos_ARCH_AMD_GFX90A=ON -DKokkos_ENABLE_ROCTHRUST=OFF) ;;
    esac
    log "building Kokkos 4.6.01 ($variant) into $prefix"
    build_kokkos "$src" "$cache/$variant-build" "$prefix" "$variant" "${opts[@]}"
  fi
  echo "$prefix"
  exit 0
fi

# --- Kokkos 3.4.1 (OpenMP + Serial) from Debian's trilinos source package ----------------------
# Debian's prebuilt libtrilinos-kokkos-dev has only the Serial backend, so we build Kokkos from
# the same source package with OpenMP enabled. A private apt configuration adds the deb-src
# entry without touching the system's sources.
if [[ ! -f $kokkos_prefix/lib/cmake/Kokkos/KokkosConfig.cmake ]]; then
  work=$cache/kokkos-src
  mkdir -p "$work"
  if [[ ! -d $work/kokkos ]]; then
    aptdir=$cache/apt
    mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial" "$aptdir/sources.list.d"
    derive_deb_src "$aptdir"
    cat >"$aptdir/apt.conf" <<CONF
Dir::Etc::SourceList "$aptdir/sources.list";
Dir::Etc::SourceParts "$aptdir/sources.list.d";
Dir::State::Lists "$aptdir/lists";
Dir::Cache::Archives "$aptdir/archives";
APT::Sandbox::User "root";
CONF
    log "fetching Debian's trilinos source package (for packages/kokkos)"
    APT_CONFIG=$aptdir/apt.conf apt-get update -qq >&2
    dl=$work/dl
    mkdir -p "$dl"
    (cd "$dl" && APT_CONFIG=$aptdir/apt.conf apt-get source --download-only -qq trilinos >&2)
    orig=$(ls "$dl"/trilinos_*.orig.tar.* | head -n 1)
    log "extracting packages/kokkos from $(basename "$orig")"
    top=$( (tar -tf "$orig" || true) | head -n 1 | cut -d/ -f1)
    tar -xf "$orig" -C "$work" "$top/packages/kokkos"
    mv "$work/$top/packages/kokkos" "$work/kokkos"
    rm -rf "${work:?}/$top" "$dl"
  fi
  log "building Kokkos with OpenMP and Serial into $kokkos_prefix"
  build_kokkos "$work/kokkos" "$work/build" "$kokkos_prefix" kokkos \
    -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON
fi
echo "$kokkos_prefix"
