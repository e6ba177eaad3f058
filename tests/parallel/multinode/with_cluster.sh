#!/usr/bin/env bash
# tests/parallel/multinode/with_cluster.sh N [--link RATE] -- COMMAND...: runs COMMAND with a
# cluster of N nodes up (scripts/cluster; --link shapes their links to RATE), and takes it down
# afterwards, whatever happens. Exit 77 (ctest: skipped), saying why, where this machine cannot
# host nodes (no root, no network namespaces).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
nodes=${1:?node count}; shift
link=()
if [[ "${1:-}" == --link ]]; then link=(--link "${2:?--link needs a rate}"); shift 2; fi
[[ "${1:-}" == "--" ]] && shift
# A missing script is a broken tree, not a machine without namespaces: fail, never skip.
[[ -x "$root/scripts/cluster" ]] || { echo "FAIL: $root/scripts/cluster is missing"; exit 1; }
if ! why=$("$root/scripts/cluster" check); then
  echo "SKIP: $why"
  exit 77
fi
trap '"$root/scripts/cluster" down' EXIT
"$root/scripts/cluster" up "$nodes" "${link[@]}" || exit 1
"$@"
