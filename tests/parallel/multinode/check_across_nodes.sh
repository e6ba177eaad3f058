#!/usr/bin/env bash
# Collectives, the ring all-reduce and DDP across 2 nodes x 2 ranks (run under with_cluster.sh 2):
#
#   check_across_nodes.sh "<mpirun + flags>" <test executable>...
#
# Each executable is an MPI Catch2 test that checks its results against one process's (the
# collectives against sums computed locally, DDP against a single-process model); here it runs
# with ranks 0-1 on node0 and 2-3 on node1, launched by mpirun's remote launch (cluster-rsh).
# The bytes node1's link received must grow by over 100 kB, or the traffic did not cross it.
set -uo pipefail
read -ra mpirun <<<"${1:?mpirun and its flags}"; shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cluster="$root/scripts/cluster"
mapfile -t cluster_flags < <("$cluster" mpirun-args)
rx_bytes() { ip -n "${MG_CLUSTER_PREFIX:-mg}-node1" -s link show eth0 | awk '/RX:/ { getline; print $1; exit }'; }

failures=0
for test in "$@"; do
  before=$(rx_bytes)
  log=$(mktemp "${TMPDIR:-/tmp}/mg-across.XXXXXX")
  "$cluster" exec node0 -- env OMP_NUM_THREADS=1 "${mpirun[@]}" "${cluster_flags[@]}" -x OMP_NUM_THREADS \
    -H node0:2,node1:2 -np 4 "$test" >"$log" 2>&1
  status=$?
  if ((status != 0)); then cat "$log"; else tail -n 2 "$log"; fi
  rm -f "$log"
  crossed=$(( $(rx_bytes) - before ))
  if ((status != 0)); then
    echo "FAIL: $(basename "$test") across 2 nodes x 2 ranks (status $status)"
    failures=$((failures + 1))
  elif ((crossed < 100000)); then
    echo "FAIL: $(basename "$test"): node1's link received only $crossed bytes"
    failures=$((failures + 1))
  else
    echo "ok: $(basename "$test") passed across 2 nodes x 2 ranks; node1's link received $crossed bytes"
  fi
done
((failures == 0)) || { echo "check_across_nodes: $failures failure(s)"; exit 1; }
echo "check_across_nodes: passed"
