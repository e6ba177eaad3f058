#!/usr/bin/env bash
# scripts/flight-report on hostile or damaged dumps: it reads bounded input, refuses what it cannot
# use with one line, and keeps distinct exit codes -- 0 the ranks agree, 1 a culprit named, 2 nothing
# (or dumps missing), 3 bad input. Each run gets 20 s and 2 GB of address space: a world size of
# 10^12 used to grow to 5.6 GB, a mismatch at sequence 10^15 looped in range(), a FIFO named
# rank-0.json hung, a symlink to /dev/zero raised MemoryError, and a missing key, an array,
# "rank": "0" or deep nesting ended in a traceback with exit 1 -- the same code as "culprit named".
#
#   check_flight_report_input.sh [path/to/flight-report]
set -uo pipefail
report=${1:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/scripts/flight-report"}
work=$(mktemp -d "${TMPDIR:-/tmp}/flight-report-input.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# dump DIR RANK WORLD [ENTRY_JSON...]: a well-formed dump (entries given as JSON objects' overrides),
# queued as one tab-separated line; write_dumps writes every queued dump in one Python process (a
# Python start costs a quarter of a second on a busy 2-core machine).
dump() {
  local IFS=$'\t'
  echo "$*" >>"$work/dumps.tsv"
}
write_dumps() {
  python3 - "$work/dumps.tsv" <<'PY'
import json, os, sys
for spec in open(sys.argv[1]).read().splitlines():
    folder, rank, world, *overrides = spec.split("\t")
    entries = []
    for i, extra in enumerate(overrides):
        e = {"id": i, "group": "world", "sequence": i + 1, "op": "allreduce(sum)", "in_count": 8,
             "out_count": 8, "dtype": "f32", "device": "cpu", "state": "completed", "queued_ns": 1,
             "started_ns": 2, "finished_ns": 3, "caller": "step %d" % i, "error": ""}
        e.update(json.loads(extra))
        entries.append(e)
    d = {"rank": int(rank), "world_size": int(world), "host": "h", "pid": 1, "capacity": 2000,
         "recorded": len(entries), "reason": "test", "entries": entries}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "rank-%d.json" % int(rank)), "w") as f:
        json.dump(d, f)
PY
}

# expect CODE NAME DIR [TEXT]: flight-report DIR exits CODE within 20 s (2 GB of address space),
# printing TEXT; with code 3, one line and no traceback.
expect() {
  local want=$1 name=$2 dir=$3 text=${4:-} status
  (ulimit -v 2000000; timeout 20 "$report" "$dir") >"$work/out" 2>&1
  status=$?
  if ((status != want)); then
    fail "$name: exit status $status, want $want"
    head -c 600 "$work/out"
    return
  fi
  [[ -z "$text" ]] || grep -qF -- "$text" "$work/out" || { fail "$name: no '$text' in: $(head -c 300 "$work/out")"; return; }
  if ((want == 3)); then
    grep -q "Traceback" "$work/out" && { fail "$name: a traceback"; return; }
    [[ $(wc -l <"$work/out") -eq 1 ]] || { fail "$name: $(wc -l <"$work/out") lines, want 1"; return; }
  fi
  echo "ok: $name (status $status: $(head -n 1 "$work/out" | cut -c1-110))"
}

# The dumps: well-formed ones, and hostile values written as JSON.
dump "$work/agree" 0 2 '{}' '{}'
dump "$work/agree" 1 2 '{}' '{}'
dump "$work/culprit" 0 3 '{}' '{}'
dump "$work/culprit" 2 3 '{}' '{}'
dump "$work/culprit" 1 3 '{}' '{"op": "barrier", "dtype": ""}'
dump "$work/missing" 0 2 '{}'
dump "$work/world" 0 1000000000000 '{}'
dump "$work/far" 0 3 '{"sequence": 1000000000000000}'
dump "$work/far" 2 3 '{"sequence": 1000000000000000}'
dump "$work/far" 1 3 '{"sequence": 1000000000000000, "op": "barrier", "dtype": "", "caller": "other"}'
dump "$work/string" 0 1 '{}'
dump "$work/state" 0 1 '{"state": "exploded"}'
dump "$work/twice" 0 2 '{}'
write_dumps || fail "writing the dumps"
# Damaged ones, made from files.
sed -i 's/"rank": 0/"rank": "0"/' "$work/string/rank-0.json"
cp "$work/twice/rank-0.json" "$work/twice/rank-1.json"
mkdir -p "$work/empty" "$work/nokey" "$work/array" "$work/deep" "$work/fifo" "$work/zero"
echo '{"rank": 0, "world_size": 1}' >"$work/nokey/rank-0.json"
echo '[1, 2]' >"$work/array/rank-0.json"
{ printf '%0.s[' {1..200000}; printf '%0.s]' {1..200000}; echo; } >"$work/deep/rank-0.json"
mkfifo "$work/fifo/rank-0.json"
ln -s /dev/zero "$work/zero/rank-0.json"

# The four outcomes on well-formed dumps.
expect 0 "two ranks agree" "$work/agree" "the ranks agree"
expect 1 "rank 1 calls a barrier" "$work/culprit" "CULPRIT: rank 1 called barrier at #2"
expect 2 "rank 1 left no dump" "$work/missing" "left none"
expect 2 "no dumps" "$work/empty" "no flight-recorder dumps"

# Hostile values.
expect 3 "world size 10^12" "$work/world" "'world_size' is 1000000000000, outside"
expect 1 "a mismatch at sequence 10^15" "$work/far" "CULPRIT: rank 1 called barrier at #1000000000000000"
expect 3 "a missing key" "$work/nokey" "has no 'host'"
expect 3 "an array" "$work/array" "not a JSON object but list"
expect 3 '"rank": "0"' "$work/string" "'rank' is str, not an integer"
expect 3 "deep nesting" "$work/deep" "nested too deeply"
expect 3 "a FIFO named rank-0.json" "$work/fifo" "not a regular file"
expect 3 "a symlink to /dev/zero" "$work/zero" "not a regular file"
expect 3 "an unknown state" "$work/state" "state 'exploded'"
expect 3 "a rank dumped twice" "$work/twice" "rank 0 dumped twice"

if ((failures > 0)); then
  echo "check_flight_report_input: $failures failure(s)"
  exit 1
fi
echo "check_flight_report_input: passed"
