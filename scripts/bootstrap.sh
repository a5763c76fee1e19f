#!/usr/bin/env bash
# Installs what tessera's build, tests, benchmarks and examples need on a Debian bookworm
# machine. Idempotent: a second run only checks, and takes a second or two.
#
#   scripts/bootstrap.sh            # packages + Kokkos (OpenMP + Serial) into the cache prefix
#   TESSERA_SKIP_APT=1 ...          # do not touch Debian packages (machines without root)
#
# Prints the Kokkos prefix on its last line, so callers can do
#   KOKKOS_PREFIX=$(scripts/bootstrap.sh | tail -n 1)
set -euo pipefail

cache=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
kokkos_prefix=${TESSERA_KOKKOS_PREFIX:-$cache/kokkos-3.4.1-openmp}
mkdir -p "$cache"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------
packages=(
  build-essential cmake pkg-config dpkg-dev
  libboost-dev libxsimd-dev xtl-dev catch2 libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev libdnnl-dev
  dataset-fashion-mnist zlib1g-dev
  clang-format
)
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
    cat >"$aptdir/sources.list" <<SRC
deb-src http://deb.debian.org/debian bookworm main
SRC
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
  cmake -S "$work/kokkos" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_STANDARD=17 -DCMAKE_INSTALL_PREFIX="$kokkos_prefix" \
    -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DBUILD_SHARED_LIBS=ON \
    -DKokkos_ENABLE_TESTS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"$cache/kokkos-configure.log" 2>&1 ||
    { cat "$cache/kokkos-configure.log" >&2; exit 1; }
  cmake --build "$work/build" -j "$(nproc)" >"$cache/kokkos-build.log" 2>&1 ||
    { tail -n 50 "$cache/kokkos-build.log" >&2; exit 1; }
  cmake --install "$work/build" >/dev/null
  rm -rf "$work/build"
fi
echo "$kokkos_prefix"
