#!/usr/bin/env bash
# Collectives, the ring all-reduce and DDP across 2 nodes x 2 ranks (run under with_cluster.sh 2),
# then bytes on the wire beside the bytes requested:
#
#   check_across_nodes.sh "<mpirun + flags>" [--wire <wire_worker>] <test executable>...
#
# Each executable is an MPI Catch2 test that checks its results against one process's (the
# collectives against sums computed locally, DDP against a single-process model); here it runs
# with ranks 0-1 on node0 and 2-3 on node1, launched by mpirun's remote launch (cluster-rsh).
# The bytes node1's link received (its RX counter, `ip -n <prefix>-node1 -s link`, read before and
# after, launch included) must grow by over 100 kB, or the traffic did not cross it.
#
# --wire: wire_worker runs with one rank on each node, so every byte its collectives move crosses
# the veth links. Each rank reads its own node's eth0 counters around the collectives, and the
# bytes the nodes sent must be >= ProcessGroup::requested_traffic()'s total and <= 1.15 x it
# (headers, ACKs, MPI's framing, signatures, heartbeats); it prints both and the ratio.
set -uo pipefail
read -ra mpirun <<<"${1:?mpirun and its flags}"; shift
wire_worker=""
if [[ "${1:-}" == --wire ]]; then wire_worker="${2:?--wire needs the wire_worker executable}"; shift 2; fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cluster="$root/scripts/cluster"
mapfile -t cluster_flags < <("$cluster" mpirun-args)
link_bytes() {  # link_bytes NODE RX|TX: the byte counter of NODE's eth0
  ip -n "${MG_CLUSTER_PREFIX:-mg}-$1" -s link show eth0 | awk -v dir="$2:" '$1 == dir { getline; print $1; exit }'
}

failures=0
for test in "$@"; do
  before=$(link_bytes node1 RX)
  log=$(mktemp "${TMPDIR:-/tmp}/mg-across.XXXXXX")
  "$cluster" exec node0 -- env OMP_NUM_THREADS=1 "${mpirun[@]}" "${cluster_flags[@]}" -x OMP_NUM_THREADS \
    -H node0:2,node1:2 -np 4 "$test" >"$log" 2>&1
  status=$?
  if ((status != 0)); then cat "$log"; else tail -n 2 "$log"; fi
  rm -f "$log"
  crossed=$(( $(link_bytes node1 RX) - before ))
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

if [[ -n "$wire_worker" ]]; then
  tx0=$(( $(link_bytes node0 TX) + $(link_bytes node1 TX) ))
  log=$(mktemp "${TMPDIR:-/tmp}/mg-wire.XXXXXX")
  "$cluster" exec node0 -- "${mpirun[@]}" "${cluster_flags[@]}" -H node0:1,node1:1 -np 2 "$wire_worker" eth0 1.15 \
    >"$log" 2>&1
  status=$?
  cat "$log"
  whole_run=$(( $(link_bytes node0 TX) + $(link_bytes node1 TX) - tx0 ))
  # The collectives' window is the worker's own measurement; the whole run adds mpirun's launch.
  echo "the whole wire_worker run, launch included: $whole_run bytes sent on the two links"
  if ((status != 0)) || ! grep -q '^wire: .* ok$' "$log"; then
    echo "FAIL: bytes on the wire outside [1, 1.15] x the requested bytes, or the run failed (status $status)"
    failures=$((failures + 1))
  else
    echo "ok: $(grep '^wire: ' "$log")"
  fi
  rm -f "$log"
fi
((failures == 0)) || { echo "check_across_nodes: $failures failure(s)"; exit 1; }
echo "check_across_nodes: passed"
