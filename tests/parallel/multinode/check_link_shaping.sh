#!/usr/bin/env bash
# scripts/cluster --link RATE shapes each node's link to RATE, and `counters` sees the bytes:
#
#   with_cluster.sh 2 --link 100mbit -- check_link_shaping.sh <link_probe> 100
#
# node0 -> node1 and node1 -> node0 each carry one TCP stream of 12.5 MB (1 s at 100 Mbit/s).
# Each direction's payload rate must be within [0.8, 1.05] x RATE (Ethernet, IP and TCP headers
# take ~4% of the shaped frame rate), and the sender's tx_bytes (scripts/cluster counters) must
# have grown by at least the payload and at most 1.1 x it. Then the links are unshaped and the
# same stream must run at more than twice RATE: the rate was the shaping's, not the machine's.
set -uo pipefail
probe=${1:?link_probe executable}
mbit=${2:?the shaped rate in Mbit/s}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cluster="$root/scripts/cluster"
bytes=12500000
failures=0

tx_of() { "$cluster" counters "$1" | awk '{print $2}'; }

# stream FROM TO: prints the receiver's rate in Mbit/s (empty on failure).
stream() {
  local from=$1 to=$2 out
  out=$(mktemp "${TMPDIR:-/tmp}/mg-probe.XXXXXX")
  "$cluster" exec "$to" -- "$probe" recv 5901 >"$out" 2>&1 &
  local receiver=$!
  "$cluster" exec "$from" -- "$probe" send "$to" 5901 "$bytes" || echo "sender $from failed" >&2
  wait "$receiver" || { echo "receiver on $to failed: $(cat "$out")" >&2; }
  awk '/^received/ {print $4}' "$out"
  rm -f "$out"
}

check() {  # check WHAT CONDITION-AS-AWK-EXPRESSION: counts a failure when false
  if awk "BEGIN { exit !($2) }"; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}

for pair in "node0 node1" "node1 node0"; do
  read -r from to <<<"$pair"
  tx_before=$(tx_of "$from")
  rate=$(stream "$from" "$to")
  sent=$(($(tx_of "$from") - tx_before))
  [[ -n "$rate" ]] || rate=0
  check "$from -> $to at $rate Mbit/s on a $mbit Mbit/s link (within [0.8, 1.05] x)" \
    "$rate >= 0.8 * $mbit && $rate <= 1.05 * $mbit"
  check "$from's eth0 sent $sent bytes for a $bytes-byte payload (within [1, 1.1] x)" \
    "$sent >= $bytes && $sent <= 1.1 * $bytes"
done

"$cluster" link node0 none >/dev/null
"$cluster" link node1 none >/dev/null
unshaped=$(stream node0 node1)
[[ -n "$unshaped" ]] || unshaped=0
check "unshaped node0 -> node1 at $unshaped Mbit/s, over twice the shaped $mbit" "$unshaped > 2 * $mbit"

((failures == 0)) || { echo "check_link_shaping: $failures failure(s)"; exit 1; }
echo "check_link_shaping: passed"
