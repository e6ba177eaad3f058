#!/usr/bin/env bash
# The examples refuse bad flag values at once, naming the flag, in a world of one rank (no mpirun):
# train_ddp --epochs 0 (a scheduler message naming no flag), --limit-train -3 and
# --check-replicas-every -1 (accepted), --workers 100000 (18 s of thread creation, then EAGAIN),
# --bucket-cap-mb inf (an undefined cast); train_gpt_parallel --batch 0 ("loss -nan", exit 0),
# --batch 3000000000 (unbounded growth), --text a directory ("basic_filebuf::underflow").
#
#   check_example_flags.sh <train_ddp> <train_gpt_parallel>
train_ddp=${1:?train_ddp}
train_gpt=${2:?train_gpt_parallel}
# shellcheck source=tests/check_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../check_lib.sh" check_example_flags

# expect NAME MESSAGE -- command...: a non-zero exit within 20 s and MESSAGE in its output.
expect() {
  local name=$1 message=$2 status
  shift 3
  timeout 20 "$@" >"$work/out" 2>&1
  status=$?
  if ((status == 0 || status == 124)); then
    fail "$name: exit status $status, want an error within 20 s"
    tail -n 3 "$work/out"
    return
  fi
  grep -qF -- "$message" "$work/out" || { fail "$name: no '$message' in: $(tail -n 2 "$work/out")"; return; }
  echo "ok: $name (status $status: $(grep -F -- "$message" "$work/out" | head -n 1 | cut -c1-120))"
}

expect "train_ddp --epochs 0" "--epochs must be" -- "$train_ddp" --epochs 0
expect "train_ddp --limit-train -3" "--limit-train must be" -- "$train_ddp" --limit-train -3
expect "train_ddp --check-replicas-every -1" "--check-replicas-every must be" -- "$train_ddp" --check-replicas-every -1
expect "train_ddp --workers 100000" "--workers must be" -- "$train_ddp" --workers 100000
expect "train_ddp --bucket-cap-mb inf" "--bucket-cap-mb must be" -- "$train_ddp" --bucket-cap-mb inf
expect "train_ddp --batch-size 0" "--batch-size must be" -- "$train_ddp" --batch-size 0
expect "train_gpt_parallel --batch 0" "--batch must be" -- "$train_gpt" --batch 0
expect "train_gpt_parallel --batch 3000000000" "--batch must be" -- "$train_gpt" --batch 3000000000
expect "train_gpt_parallel --text <a directory>" "is not a regular file" -- "$train_gpt" --text "$work"

check_done
