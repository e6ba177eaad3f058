#!/usr/bin/env bash
# tests/multinode/with_cluster.sh N -- COMMAND...: runs COMMAND with a cluster of N nodes up
# (scripts/cluster), and takes it down afterwards, whatever happens. Exit 77 (ctest: skipped),
# saying why, where this machine cannot host nodes (no root, no network namespaces).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
nodes=${1:?node count}; shift
[[ "${1:-}" == "--" ]] && shift
if ! why=$("$root/scripts/cluster" check); then
  echo "SKIP: $why"
  exit 77
fi
trap '"$root/scripts/cluster" down' EXIT
"$root/scripts/cluster" up "$nodes" || exit 1
"$@"
