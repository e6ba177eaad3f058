#!/usr/bin/env bash
# SIGTERM (what Slurm and mpirun send before they kill a job) at step >= 12 of a 2-rank train_ddp:
# every rank must save that step and exit 0; a second run with --resume must then end with files
# byte-identical (cmp) to a run that was never stopped.
#
# What that proves, and why the flags: the model has dropout and the inputs get noise, both drawn
# from each rank's own generator (seed + rank), so the resumed run matches only if every rank got
# its own generator state back (with rank 0's on every rank -- the old bug -- the files differ).
# Each rank has its own checkpoint directory (--checkpoint-dir .../rank{rank}): only rank 0's is
# ever written, and rank 1 must resume from what rank 0 sends it, as on nodes without a shared
# filesystem.
#
#   check_sigterm_resume.sh <train_ddp> <mpirun and its flags...>   (MG_TRAIN_FLAGS: e.g. --zero)
set -uo pipefail
train_ddp=${1:?train_ddp}; shift
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/mg-sigterm.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
read -ra extra <<<"${MG_TRAIN_FLAGS:-}"
# 3 epochs of 48 steps: the signal, sent once step 12 is logged, must arrive while training runs
# (one epoch takes 0.3 s here, less than the log polling and the signal delivery can be trusted with).
train=(--model mlp --dropout 0.2 --input-noise 0.1 --epochs 3 --train-subset 3072 --batch-size 32 --log-steps
  --resume "${extra[@]}")
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=train_log.sh
source "$(dirname "${BASH_SOURCE[0]}")/train_log.sh"

"${mpirun[@]}" -np 2 "$train_ddp" "${train[@]}" --checkpoint-dir "$work/reference/rank{rank}" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the uninterrupted run failed"; }

"${mpirun[@]}" -np 2 "$train_ddp" "${train[@]}" --checkpoint-dir "$work/run/rank{rank}" >"$work/run.log" 2>&1 &
job=$!
step=$(wait_for_step "$work/run.log" 12)
pids=$(sed -nE 's/^rank [0-9]+ pid ([0-9]+) on node .*/\1/p' "$work/run.log")
[[ $(wc -w <<<"$pids") -eq 2 ]] || { cat "$work/run.log"; fail "the ranks did not announce their pids"; }
# shellcheck disable=SC2086
kill -TERM $pids
wait "$job"
status=$?
cat "$work/run.log" | grep -v '^step '
((status == 0)) || fail "the job stopped by SIGTERM exited with status $status, not 0"
saved=$(sed -nE 's/^SIGTERM: saved step ([0-9]+) .*/\1/p' "$work/run.log")
[[ -n "$saved" ]] || fail "no 'SIGTERM: saved step' line"
[[ -d "$work/run/rank0/$(printf 'step-%08d' "$saved")" ]] || fail "step $saved's checkpoint is not in $work/run/rank0"
echo "SIGTERM at step ${step:-?}: every rank saved step $saved and exited 0"

"${mpirun[@]}" -np 2 "$train_ddp" "${train[@]}" --checkpoint-dir "$work/run/rank{rank}" >"$work/resume.log" 2>&1 ||
  { cat "$work/resume.log"; fail "the resumed run failed"; }
grep -q "resumed from .*step-$(printf '%08d' "$saved")" "$work/resume.log" || fail "the second run did not resume at step $saved"
[[ -e "$work/run/rank1" ]] && fail "rank 1 wrote into its own checkpoint directory (only rank 0 writes)"
final=$(basename "$(find "$work/reference/rank0" -maxdepth 1 -name 'step-*' | sort | tail -n 1)")
for file in model.safetensors optimizer.safetensors lr_scheduler.safetensors; do
  cmp -s "$work/reference/rank0/$final/$file" "$work/run/rank0/$final/$file" ||
    fail "$final/$file differs from the run never stopped"
  echo "ok: $final/$file is byte-identical to the run that was never stopped"
done
echo "check_sigterm_resume: passed"
