# shellcheck shell=bash
# Sourced by the scripts that interrupt a running train_ddp (check_sigterm_resume.sh,
# ../multinode/check_recovery.sh): reading its --log-steps output while it runs.

# wait_for_step LOG N: polls LOG (every 50 ms, for at most 30 s) until a line "step K" with K >= N
# is there; prints the last step seen (empty if none), so the caller can say where it struck.
wait_for_step() {
  local log="$1" want="$2" step="" i
  for ((i = 0; i < 600; ++i)); do
    step=$(grep -oE '^step [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
    ((${step:-0} >= want)) && break
    sleep 0.05
  done
  echo "$step"
}
