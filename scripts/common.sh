# shellcheck shell=bash
# Shared by scripts/run and scripts/test (sourced, not executed).
#
#   mg_ensure_packages [PKG...]   apt-get install whatever of MG_APT_PACKAGES (and PKG...) is missing
#   mg_configure_build DIR ARGS   cmake -G Ninja -S <repo> -B DIR ARGS, then build it
#
# Environment: MG_JOBS (build parallelism, default nproc), MG_SKIP_APT=1 (trust the machine).

MG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MG_JOBS="${MG_JOBS:-$(nproc 2>/dev/null || echo 2)}"

# Everything a build + full test run on Debian 12 needs (CUDA is optional and never installed).
# libopenblas0-openmp: the OpenMP-threaded OpenBLAS, which cooperates with multigrad's OpenMP
# kernels (cmake/MultigradDeps.cmake says why); the system default stays the pthread build.
# lld: the linker the build uses when present (CMakeLists.txt: a link in about 40 % of ld.bfd's time).
MG_APT_PACKAGES=(cmake g++ lld ninja-build ccache catch2 libopenblas-dev libopenblas0-openmp libopenmpi-dev openmpi-bin
                 zlib1g-dev nlohmann-json3-dev libcli11-dev dataset-fashion-mnist libboost-context-dev)

# Debian's OpenBLAS 0.3.21 identifies some virtualised Xeons as "Prescott" and runs its
# SSE3 kernels: sgemm measured 51 GFLOP/s here vs 206 with the SkylakeX kernels
# (docs/kernels.md). Pick the kernels from the CPU flags unless the user already chose.
if [[ -z "${OPENBLAS_CORETYPE:-}" && -r /proc/cpuinfo ]]; then
  if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi

# ccache in front of the compilers. The builds share most objects: build-emu/'s CPU-side library,
# tests and examples preprocess to the same text as build/'s (only -D flags they never test
# differ), and ccache's preprocessor mode hashes that text, not the -D flags, so the second build
# takes them from the cache instead of compiling them again. The cache lives in the checkout
# (.ccache/, ignored by git), so a fresh clone starts with an empty one, as CI does.
# MG_NO_CCACHE=1 turns it off. (Asked at configure time: mg_ensure_packages may install it first.)
# Not in front of nvcc: no other build shares its objects (build-emu/ compiles the .cu files as
# C++), so on an empty cache every lookup misses, and a miss costs a preprocessing pass of its
# own (1.4 CPU-s of the 12.5 for kernels/cuda/elementwise.cu; about 34 for the library's 24 .cu
# files). ninja already recompiles only what changed.
export CCACHE_DIR="${CCACHE_DIR:-$MG_ROOT/.ccache}"
mg_launcher_args() {
  if [[ "${MG_NO_CCACHE:-0}" != 1 ]] && command -v ccache >/dev/null 2>&1; then
    printf '%s\n' -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -UCMAKE_CUDA_COMPILER_LAUNCHER
  else
    printf '%s\n' -UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER
  fi
}

mg_log() { printf '\n==> %s\n' "$*" >&2; }
mg_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

mg_now() { date +%s; }
mg_elapsed() { echo "$(( $(mg_now) - $1 ))s"; }

mg_ensure_packages() {
  if [[ "${MG_SKIP_APT:-0}" == 1 ]]; then
    mg_log "MG_SKIP_APT=1: not checking system packages"
    return 0
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    mg_log "no dpkg-query (not Debian?): assuming these are installed: ${MG_APT_PACKAGES[*]}"
    return 0
  fi
  local missing=() pkg
  for pkg in "${MG_APT_PACKAGES[@]}" "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    mg_log "system packages: all present"
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then
    printf 'error: missing packages. Install them with:\n  sudo apt-get install -y %s\n' "${missing[*]}" >&2
    exit 1
  fi
  mg_log "installing missing packages: ${missing[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# mg_configure_build <build-dir> [cmake args...] [-- <build args...>]
# Configures with Ninja (Release unless the args say otherwise) and builds with -j$MG_JOBS.
mg_configure_build() {
  local dir="$1"; shift
  local cfg=() bld=()
  while (($#)); do
    if [[ "$1" == "--" ]]; then shift; bld=("$@"); break; fi
    cfg+=("$1"); shift
  done
  # A build dir made by another generator (e.g. Unix Makefiles) can't be reused with Ninja.
  if [[ -f "$dir/CMakeCache.txt" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
    mg_log "$dir was configured with another generator: starting it afresh"
    rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
  fi
  local t0 launcher; t0=$(mg_now)
  mapfile -t launcher < <(mg_launcher_args)
  mg_log "configure $dir: ${cfg[*]} ${launcher[*]}"
  cmake -S "$MG_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="${MG_BUILD_TYPE:-Release}" \
    "${launcher[@]}" "${cfg[@]}"
  mg_log "configured $dir in $(mg_elapsed "$t0"); building with -j$MG_JOBS ${bld[*]}"
  t0=$(mg_now)
  cmake --build "$dir" -j"$MG_JOBS" "${bld[@]}"
  mg_log "built $dir in $(mg_elapsed "$t0")"
}

# Whether nvidia-smi lists a GPU on this machine.
mg_gpus_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# CMake args that pick CUDA when this machine has a toolkit (MG_CUDA=AUTO decides the rest).
# Where a GPU is present, or $MG_CUDA_ARCHS is set: the CUDA library, for sm_90 (machine code and
# PTX) or for $MG_CUDA_ARCHS. Where none is: MG_CUDA=PTX, the CPU library with every kernel
# compiled to PTX by nvcc as a check (CMakeLists.txt has why and the figures): nothing could run
# the CUDA library there, build-emu/ compiles and runs the kernels, and the CUDA library cost 212
# CPU-s of nvcc in a fresh build (the PTX check about 60) plus its real-CUDA test executables.
mg_cuda_args() {
  if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    printf '%s\n' -DMG_CUDA=AUTO
    return
  fi
  local args=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  if [[ -n "${MG_CUDA_ARCHS:-}" ]]; then
    args+=(-DMG_CUDA=AUTO "-DMG_CUDA_ARCHS=$MG_CUDA_ARCHS")
  elif mg_gpus_present; then
    args+=(-DMG_CUDA=AUTO -DMG_CUDA_ARCHS=90)
  else
    args+=(-DMG_CUDA=PTX -DMG_CUDA_ARCHS=90-virtual)
  fi
  printf '%s\n' "${args[@]}"
}
