#!/usr/bin/env bash
# Install a built multigrad tree into a temporary prefix, then configure, build and
# run tests/install/consumer against it with find_package(multigrad): the same program built at
# C++17, C++20 and C++23 with -Wall -Wextra -Wpedantic -Werror (headers included).
#
#   tests/install/run_install_test.sh <build-dir> [<c++ compiler> [<cmake generator>]]
#
# Registered in ctest as `install_consumer` (label `install`).
set -euo pipefail

build_dir=${1:?usage: run_install_test.sh <build-dir> [cxx-compiler] [generator]}
cxx=${2:-}
generator=${3:-}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mg-install-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "== install $build_dir -> $tmp/prefix"
cmake --install "$build_dir" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"; exit 1; }
test -f "$tmp/prefix/lib/cmake/multigrad/multigradConfig.cmake" \
  || { echo "no multigradConfig.cmake under $tmp/prefix/lib/cmake/multigrad"; exit 1; }

args=(-S "$here/consumer" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$tmp/prefix")
[[ -n "$cxx" ]] && args+=("-DCMAKE_CXX_COMPILER=$cxx")
[[ -n "$generator" ]] && args+=(-G "$generator")
echo "== configure consumer"
cmake "${args[@]}"
echo "== build consumer"
cmake --build "$tmp/build"
for std in 17 20 23; do
  echo "== run consumer_cxx$std"
  "$tmp/build/consumer_cxx$std"
done
