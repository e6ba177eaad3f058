#!/usr/bin/env bash
# scripts/mg-launch around a REAL `mpirun --enable-recovery`, the setup docs/fault-tolerance.md asks
# for. Open MPI 4.1's mpirun exits 0 there whatever its ranks do (`mpirun --enable-recovery -np 2
# sh -c 'exit 3'` returns 0), so mg-launch must learn each rank's own exit status (it makes
# scripts/mg-launch-rank the ranks' fork agent) and report the attempt as failed.
#
#   check_mg_launch_recovery.sh <mg-launch> <timeout_worker or ""> -- <mpirun> [mpirun flags...]
#
# With a timeout_worker, also: a job whose rank 1 is stuck, so the others time out and call
# MPI_Abort -- Open MPI does not always print "MPI_ABORT was invoked" then, the exit statuses decide.
# shellcheck disable=SC2016  # the single-quoted $OMPI_COMM_WORLD_RANK etc. are for the ranks' shells
launch=${1:?mg-launch}
worker=${2-}
shift 2
[[ "${1:-}" == "--" ]] && shift
mpirun=("$@" --enable-recovery)
# shellcheck source=tests/check_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../check_lib.sh" check_mg_launch_recovery

# expect STATUS_TEST NAME -- mg-launch args...: runs it (stderr to $work/err), checks the status.
expect() {
  local want=$1 name=$2 status
  shift 3
  timeout 120 "$launch" "$@" >"$work/out" 2>"$work/err"
  status=$?
  case "$want" in
    nonzero) ((status != 0 && status != 124)) || { fail "$name: exit status $status, want non-zero"; cat "$work/err"; return 1; } ;;
    *) ((status == want)) || { fail "$name: exit status $status, want $want"; cat "$work/err"; return 1; } ;;
  esac
  echo "ok: $name (status $status)"
}

# The premise: this mpirun really does exit 0 for a failed job (else the test proves less).
"${mpirun[@]}" -np 2 sh -c 'exit 3' >/dev/null 2>&1
echo "note: plain ${mpirun[*]} -np 2 sh -c 'exit 3' exits $?"

expect 3 "every rank exits 3" -- --max-restarts 0 -- "${mpirun[@]}" -np 2 sh -c 'exit 3' &&
  { grep -q "attempt 0 failed with status 3" "$work/err" || fail "every rank exits 3: no 'attempt 0 failed' line"; }
grep -q "attempt 0 succeeded" "$work/err" && fail "every rank exits 3: logged as succeeded"
expect 5 "only rank 1 of 3 exits 5" -- --max-restarts 0 -- "${mpirun[@]}" -np 3 \
  sh -c '[ "$OMPI_COMM_WORLD_RANK" != 1 ] || exit 5' &&
  { grep -q "rank 1 exited with status 5" "$work/err" || fail "rank 1 exits 5: rank 1 not named"; }
expect nonzero "rank 1 killed by SIGKILL" -- --max-restarts 0 -- "${mpirun[@]}" -np 2 \
  sh -c '[ "$OMPI_COMM_WORLD_RANK" != 1 ] || kill -KILL $$'
expect 2 "always fails: each attempt counted" -- --max-restarts 1 -- "${mpirun[@]}" -np 2 sh -c 'exit 2' &&
  { [[ $(grep -c "attempt [0-9]* failed" "$work/err") -eq 2 ]] || fail "always fails: want 2 failed attempts"; }
# Success stays success, and a failure then a success restarts once.
expect 0 "every rank succeeds" -- --max-restarts 0 -- "${mpirun[@]}" -np 2 true
expect 0 "rank 0 fails once, then succeeds" -- --max-restarts 2 -- "${mpirun[@]}" -np 2 \
  sh -c '[ "$MG_LAUNCH_ATTEMPT" = 1 ] || [ "$OMPI_COMM_WORLD_RANK" != 0 ]' &&
  { grep -q "restart 1 of 2" "$work/err" || fail "fails once: no restart logged"; }
# The rank wrapper alone, as mpirun's fork agent: it keeps the program's stdin (mpirun gives it to
# rank 0; mg-launch itself runs the job with stdin from /dev/null) and records the status.
mkdir -p "$work/ranks"
got=$(printf 'hello\n' | OMPI_MCA_orte_fork_agent="$(dirname "$launch")/mg-launch-rank $work/ranks" \
  "${mpirun[@]}" -np 1 sh -c 'read -r x && echo "got $x"' 2>&1)
[[ "$got" == *"got hello"* ]] || fail "stdin under mg-launch-rank: rank 0 printed '$got'"
[[ "$(cat "$work/ranks/rank-0" 2>&1)" == 0 ]] || fail "mg-launch-rank recorded '$(cat "$work/ranks/rank-0" 2>&1)' for rank 0, want 0"

# A stuck rank: the others' collective times out (2 s) and they call MPI_Abort.
if [[ -n "$worker" ]]; then
  expect nonzero "a timeout ends in MPI_Abort" -- --max-restarts 0 --kill-after 5 -- "${mpirun[@]}" -np 3 \
    "$worker" stuck 2
fi

check_done
