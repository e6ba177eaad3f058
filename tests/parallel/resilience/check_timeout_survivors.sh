#!/usr/bin/env bash
# Runs the timeout_worker job and checks what EVERY surviving rank reported, not just one of them:
#
#   tests/parallel/resilience/check_timeout_survivors.sh <mode> <world size> <timeout s> -- <mpiexec ... timeout_worker ...>
#
# The job's rank 1 gets stuck (mode stuck) or is killed (mode dead) before the second allreduce;
# every other rank must print exactly one "rank R caught after S s: <error>" line, whose error names
# the allreduce and the timeout, with S within the configured timeout (+ slack for scheduling on a
# loaded machine; for a stuck rank also not before it: nothing may be declared lost early), and
# the whole job must end soon after (the poisoned group aborts it: no hang).
#
# MG_EXPECT=heartbeat: the failure must be found by the heartbeat instead (parallel/comm/heartbeat.h;
# the third argument is then its bound, MG_FAILURE_DETECTION_S): every survivor's error names
# "rank 1 (node <host>, pid <pid>) is lost", within the bound (+ slack) and not before it.
# MG_EXPECT=exited: rank 1 exits on an error of its own (mode error): every survivor's error names
# "rank 1 (node <host>, pid <pid>) is lost: it is exiting with status 1 ...", within the third
# argument (+ slack), although the collective timeout is far longer.
# MG_EXPECT=stall: rank 1 is alive but its progress stalled (modes spin, block); the third argument
# is the stall bound the job should arrive at: every survivor's error names "rank 1 (node <host>,
# pid <pid>) is stuck", rank 1's last operation and the stall bound, within it (+ slack) and not
# before it.
set -uo pipefail

mode=${1:?mode}; world=${2:?world size}; timeout_s=${3:?timeout}; shift 3
[[ "${1:-}" == "--" ]] && shift
slack_s=${MG_TIMEOUT_SLACK_S:-3}   # the watchdog polls; ranks start at slightly different times
job_limit_s=$((timeout_s + 20))    # detection + mpirun tearing the job down

log="$(mktemp "${TMPDIR:-/tmp}/mg-timeout-test.XXXXXX")"
trap 'rm -f "$log"' EXIT
start=$(date +%s.%N)
timeout -k 5 "$job_limit_s" "$@" >"$log" 2>&1  # -k: an mpiexec that ignores TERM is killed
job_status=$?
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
cat "$log"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
is_true() { awk "BEGIN { exit !($1) }"; }  # a comparison of decimals (no bc on a minimal Debian)

if [[ $job_status -eq 77 ]]; then echo "SKIP: the job skipped itself (exit 77)"; exit 77; fi
[[ $job_status -eq 124 ]] && fail "the job did not end within ${job_limit_s} s (a hang)"
for ((rank = 0; rank < world; ++rank)); do
  [[ $rank -eq 1 ]] && continue  # the stuck or dead one
  early_fraction=0.95             # "not before the timeout", with a little room for timing
  lines=$(grep -c "^rank $rank caught after " "$log")
  if [[ $lines -ne 1 ]]; then
    fail "rank $rank printed $lines 'caught' lines, expected 1"
    continue
  fi
  line=$(grep "^rank $rank caught after " "$log")
  seconds=$(sed -E 's/^rank [0-9]+ caught after ([0-9.]+) s: .*/\1/' <<<"$line")
  message=${line#*s: }
  [[ "$message" == *allreduce* ]] || fail "rank $rank's error does not name the allreduce: $message"
  if [[ "${MG_EXPECT:-timeout}" == stall ]]; then
    [[ "$message" =~ "rank 1 (node "[^,]+", pid "[0-9]+") is stuck: its progress" ]] ||
      fail "rank $rank's error does not name rank 1, its node and pid as stuck: $message"
    [[ "$message" == *"last operation: allreduce"*"on rank 1 of $world"* ]] ||
      fail "rank $rank's error does not name rank 1's last operation: $message"
    [[ "$message" == *"stall bound "* ]] || fail "rank $rank's error does not name the stall bound: $message"
  elif [[ "${MG_EXPECT:-timeout}" == exited ]]; then
    [[ "$message" =~ "rank 1 (node "[^,]+", pid "[0-9]+") is lost: it is exiting with status 1 after an error of its own" ]] ||
      fail "rank $rank's error does not name rank 1, its node and pid as exiting on an error: $message"
  elif [[ "${MG_EXPECT:-timeout}" == heartbeat ]]; then
    [[ "$message" =~ "rank 1 (node "[^,]+", pid "[0-9]+") is lost" ]] ||
      fail "rank $rank's error does not name rank 1, its node and pid as lost: $message"
    [[ "$message" == *"bound $timeout_s s"* ]] || fail "rank $rank's error does not name the ${timeout_s} s bound: $message"
    # Silence is timed from the peer's last beat, which can come up to one beat interval (a tenth
    # of the bound) and a scheduling delay before this rank entered the allreduce: the precise
    # "not before" is the silence the message reports, and the allreduce's own time may be short of
    # the bound by that interval.
    if [[ "$message" =~ "no beat for "([0-9.]+)" s" ]]; then
      is_true "${BASH_REMATCH[1]} < $timeout_s" &&
        fail "rank $rank declared rank 1 lost after ${BASH_REMATCH[1]} s of silence, before the ${timeout_s} s bound"
    fi
    early_fraction=0.85
  else
    [[ "$message" == *"within $timeout_s s"* ]] || fail "rank $rank's error does not name the ${timeout_s} s timeout: $message"
  fi
  if is_true "$seconds > $timeout_s + $slack_s"; then
    fail "rank $rank caught the error after $seconds s, later than the ${timeout_s} s timeout + ${slack_s} s"
  fi
  if [[ "$mode" != dead && "$mode" != error ]] && is_true "$seconds < $timeout_s * $early_fraction"; then
    fail "rank $rank gave up on a stuck peer after $seconds s, before the ${timeout_s} s timeout"
  fi
  echo "ok: rank $rank caught the error after $seconds s (timeout ${timeout_s} s)"
done
grep -q "the second allreduce completed" "$log" && fail "a rank completed the second allreduce"
echo "job ended after ${elapsed} s with status $job_status"
if ((failures > 0)); then
  echo "check_timeout_survivors: $failures failure(s)"
  exit 1
fi
echo "check_timeout_survivors: every survivor of $world ranks reported the $mode rank in time"
