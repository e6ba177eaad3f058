#!/usr/bin/env bash
# scripts/mg-launch's exit status on every way out: 0 only when an attempt of the job succeeded.
# A launcher that says "giving up" and exits 0 makes a scheduler (or a CI step) report a job
# that never ran as done -- the bug this guards against.
#
#   check_mg_launch.sh [path/to/mg-launch]
# shellcheck disable=SC2016  # the single-quoted $1 and $MG_LAUNCH_ATTEMPT are for the child shells
launch=${1:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/scripts/mg-launch"}
# shellcheck source=tests/check_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../check_lib.sh" check_mg_launch

# expect STATUS_TEST NAME -- mg-launch args...: runs it (stderr to $work/err), checks the status.
# STATUS_TEST is "0", "nonzero" or a number.
expect() {
  local want=$1 name=$2 status
  shift 3
  "$launch" "$@" >"$work/out" 2>"$work/err"
  status=$?
  case "$want" in
    nonzero) ((status != 0)) || { fail "$name: exit status 0, want non-zero"; cat "$work/err"; return; } ;;
    *) ((status == want)) || { fail "$name: exit status $status, want $want"; cat "$work/err"; return; } ;;
  esac
  echo "ok: $name (status $status)"
}

# No host answers: the job never runs.
expect nonzero "no host answers" -- --hosts nohost:1 --rsh false -- echo x
grep -q "giving up" "$work/err" || fail "no host answers: no 'giving up' line"
grep -q "^x$" "$work/out" && fail "no host answers: the job ran anyway"
# Fewer hosts than --min-hosts answer on the first attempt.
printf '#!/bin/sh\n[ "$1" = a ]\n' >"$work/only-a" && chmod +x "$work/only-a"
expect nonzero "fewer than --min-hosts (one answers)" -- --hosts a:1,b:1 --min-hosts 2 --rsh "$work/only-a" -- echo x
# Enough hosts: {hosts} and {np} are the answering ones.
expect 0 "one of two hosts answers" -- --hosts a:2,b:1 --rsh "$work/only-a" -- echo "{np} {hosts}"
grep -qx "2 a:2" "$work/out" || fail "{np} {hosts} became '$(cat "$work/out")', want '2 a:2'"

# The job: succeeds; always fails (its own status comes back); fails once then succeeds.
expect 0 "the job succeeds" -- -- true
expect 3 "the job always fails" -- --max-restarts 1 -- sh -c 'exit 3'
[[ $(grep -c "attempt [0-9]* failed" "$work/err") -eq 2 ]] || fail "always fails: want 2 failed attempts"
expect 0 "fails once, then succeeds" -- --max-restarts 2 -- sh -c '[ "$MG_LAUNCH_ATTEMPT" = 1 ]'
# mpirun --enable-recovery exits 0 after an abort: the output decides.
expect nonzero "exit 0 after an MPI abort" -- --max-restarts 0 -- sh -c 'echo "MPI_ABORT was invoked" >&2'
# Bad options.
expect 2 "--min-hosts 0" -- --min-hosts 0 --hosts a:1 -- true
expect 2 "--max-restarts x" -- --max-restarts x -- true
expect 2 "--kill-after x" -- --kill-after x -- true
expect 2 "no command" --
# An option without its value, bad --hosts entries: exit 2 naming them (not bash's own error, 1).
expect 2 "--max-restarts without a value" -- --max-restarts
grep -q "mg-launch: --max-restarts needs a value" "$work/err" || fail "--max-restarts without a value: no message"
expect 2 "--hosts without a value" -- --hosts
expect 2 "--hosts h:abc" -- --hosts h:abc -- true
grep -q "got 'h:abc'" "$work/err" || fail "--hosts h:abc: the entry is not named"
expect 2 "--hosts localhost:-3" -- --hosts localhost:-3 -- true
expect 2 "--hosts localhost:0" -- --hosts localhost:0 -- true
expect 2 "--hosts localhost" -- --hosts localhost -- true
expect 2 "--hosts a:1,,b:1" -- --hosts a:1,,b:1 -- true

# SIGTERM to mg-launch: forwarded to the job, no restart, mg-launch waits for the job to end.
"$launch" --max-restarts 3 -- sh -c 'trap "echo job-got-term; sleep 0.5; echo job-ended; exit 143" TERM; \
  echo started; while :; do sleep 0.1; done' >"$work/out" 2>"$work/err" &
launcher=$!
for ((i = 0; i < 100; ++i)); do grep -q started "$work/out" && break; sleep 0.05; done
kill -TERM "$launcher"
wait "$launcher"
status=$?
((status != 0)) || fail "SIGTERM: exit status 0"
grep -q "job-ended" "$work/out" || fail "SIGTERM: mg-launch exited before the job ended ($(tr '\n' ' ' <"$work/out"))"
grep -q "restart 1" "$work/err" && fail "SIGTERM: the job was restarted"
grep -q "no restart" "$work/err" || fail "SIGTERM: no 'no restart' line"
((failures == 0)) && echo "ok: SIGTERM forwarded, no restart (status $status)"

check_done
