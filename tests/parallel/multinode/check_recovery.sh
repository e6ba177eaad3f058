#!/usr/bin/env bash
# The restart proof, on a cluster of 2 nodes x 1 rank (run under with_cluster.sh 2):
#
#   check_recovery.sh kill <train_ddp> <mpirun> [mpirun flags...]
#       rank 1 is SIGKILLed at step >= 12; mg-launch restarts the job, which resumes from its newest
#       step checkpoint; the final model and optimizer files must be byte-identical (cmp) to those
#       of a run that never failed.
#   check_recovery.sh cut <train_ddp> <mpirun> [mpirun flags...]
#       node1's link is cut at step >= 12 (a node lost for good); the survivor reports it, mg-launch
#       finds node1 unreachable and resumes at world size 1; the result must be byte-identical to
#       the uninterrupted 2-rank run's checkpoint of that step, resumed at world size 1.
#
# Also asserted: the survivor's message names the lost rank, and the failure was detected within
# the bound (MG_FAILURE_DETECTION_S = 2 s here) plus slack. Times are printed for the docs.
#
# No shared filesystem: each node has its own checkpoint directory (--checkpoint-dir .../{node}:
# <work>/<run>/node0 and .../node1). Only rank 0 (on node0) writes and reads checkpoints; rank 1
# resumes from what rank 0 broadcasts, and node1's directory must stay empty. (The nodes are network
# namespaces over one filesystem, so node1 *could* read node0's directory; that it does not need to
# is what the separate directories show: with a reader on every rank, rank 1 would find none.)
# The model has dropout and the inputs get noise, both from each rank's own generator, so the
# byte-identical result also proves that every rank got its own generator state back.
set -uo pipefail
mode=${1:?kill or cut}; train_ddp=${2:?train_ddp}; shift 2
mpirun=("$@")
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cluster="$root/scripts/cluster"
bound_s=2
slack_s=${MG_DETECTION_SLACK_S:-4}
work=$(mktemp -d "${TMPDIR:-/tmp}/mg-recovery.XXXXXX")
trap 'rm -rf "$work"' EXIT
export MG_FAILURE_DETECTION_S=$bound_s

mapfile -t cluster_flags < <("$cluster" mpirun-args)
flags=("${cluster_flags[@]}" --enable-recovery -x MG_FAILURE_DETECTION_S -x MG_LAUNCH_ATTEMPT -x OMP_NUM_THREADS)
export OMP_NUM_THREADS=1
# 48 steps of 2 x 32 samples (one epoch of the first 3072 images), a checkpoint every 5.
train=(--model mlp --dropout 0.2 --input-noise 0.1 --epochs 1 --train-subset 3072 --batch-size 32
  --checkpoint-every 5 --log-steps --resume)

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
now() { date +%s.%N; }
seconds_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
on_node0() { "$cluster" exec node0 -- "$@"; }

# ---- the reference: 2 ranks, never interrupted, every checkpoint kept -------------------------
t0=$(now)
on_node0 "${mpirun[@]}" "${flags[@]}" -H node0:1,node1:1 -np 2 "$train_ddp" "${train[@]}" \
  --checkpoint-dir "$work/reference/{node}" --keep-checkpoints 100 >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; echo "FAIL: the uninterrupted run failed"; exit 1; }
echo "uninterrupted 2-rank run: $(seconds_between "$t0" "$(now)") s"
final=$(basename "$(find "$work/reference/node0" -maxdepth 1 -name 'step-*' | sort | tail -n 1)")

# ---- the run that fails -----------------------------------------------------------------------
launch=("$root/scripts/mg-launch" --max-restarts 2 --kill-after 2 --checkpoint-dir "$work/run/node0")
if [[ "$mode" == cut ]]; then
  launch+=(--hosts node0:1,node1:1 --min-hosts 1 --rsh "$root/scripts/cluster-rsh")
  hosts="{hosts}"; np="{np}"
else
  hosts=node0:1,node1:1; np=2
fi
t_start=$(now)
on_node0 "${launch[@]}" -- "${mpirun[@]}" "${flags[@]}" -H "$hosts" -np "$np" "$train_ddp" "${train[@]}" \
  --checkpoint-dir "$work/run/{node}" --keep-checkpoints 3 >"$work/run.log" 2>&1 &
launcher=$!

# Wait for step 12, then fail rank 1 / node 1.
# shellcheck source=../resilience/train_log.sh
source "$(dirname "${BASH_SOURCE[0]}")/../resilience/train_log.sh"
step=$(wait_for_step "$work/run.log" 12)
pid=$(sed -nE 's/^rank 1 pid ([0-9]+) on node .*/\1/p' "$work/run.log" | head -n 1)
[[ -n "$pid" ]] || { cat "$work/run.log"; echo "FAIL: rank 1 never announced its pid"; kill "$launcher"; exit 1; }
t_fail=$(now)
if [[ "$mode" == kill ]]; then
  kill -KILL "$pid"
else
  "$cluster" cut node1 >/dev/null
fi
echo "failure injected ($mode) at step ${step:-?} (rank 1, pid $pid)"

# The survivor's report, as soon as it appears.
t_detect=""
for ((i = 0; i < 400; ++i)); do
  if grep -q "rank 0\] peer lost: rank 1 (node node1" "$work/run.log"; then t_detect=$(now); break; fi
  sleep 0.05
done
wait "$launcher"
status=$?
t_end=$(now)
cat "$work/run.log"
echo "----"
((status == 0)) || fail "mg-launch ended with status $status"
if [[ -z "$t_detect" ]]; then
  fail "rank 0 never reported rank 1 (node1) lost"
else
  detection=$(seconds_between "$t_fail" "$t_detect")
  echo "detection: rank 0 reported rank 1 lost ${detection} s after the failure (bound ${bound_s} s)"
  awk -v d="$detection" -v b="$bound_s" -v s="$slack_s" 'BEGIN { exit !(d <= b + s) }' ||
    fail "detected after $detection s, later than the bound $bound_s s + $slack_s s"
fi
grep -q "restart 1 of 2: resuming from" "$work/run.log" || fail "mg-launch did not restart the job"
resumed=$(sed -nE 's/^resumed from .*\/(step-[0-9]+): .*/\1/p' "$work/run.log" | tail -n 1)
[[ -n "$resumed" ]] || fail "the restarted job did not resume from a checkpoint"
restart_s=$(seconds_between "$t_fail" "$t_end")
echo "recovery: failure at step ${step:-?}, resumed from $resumed, job done ${restart_s} s after the failure"

# ---- the proof: byte-identical results --------------------------------------------------------
for node_dir in "$work/reference/node1" "$work/run/node1"; do
  [[ -e "$node_dir" ]] && fail "$node_dir exists: a rank other than 0 wrote checkpoints"
done
if [[ "$mode" == kill ]]; then
  expected="$work/reference/node0/$final"
else
  grep -q "left out of this attempt" "$work/run.log" || fail "mg-launch did not leave node1 out"
  grep -q "saved by 2 rank(s), now 1" "$work/run.log" || fail "the job did not resume at world size 1"
  # The comparison run: the uninterrupted run's checkpoint of that step, resumed on 1 rank.
  mkdir -p "$work/switched/node0"
  cp -r "$work/reference/node0/$resumed" "$work/switched/node0/"
  on_node0 "${mpirun[@]}" "${flags[@]}" -H node0:1 -np 1 "$train_ddp" "${train[@]}" \
    --checkpoint-dir "$work/switched/{node}" >"$work/switched.log" 2>&1 || { cat "$work/switched.log"; fail "the switched run failed"; }
  final=$(basename "$(find "$work/switched/node0" -maxdepth 1 -name 'step-*' | sort | tail -n 1)")
  expected="$work/switched/node0/$final"
fi
got="$work/run/node0/$final"
for file in model.safetensors optimizer.safetensors lr_scheduler.safetensors; do
  if cmp -s "$expected/$file" "$got/$file"; then
    echo "ok: $final/$file is byte-identical to the run that never failed"
  else
    fail "$final/$file differs from the run that never failed ($expected vs $got)"
  fi
done
if ((failures > 0)); then
  echo "check_recovery $mode: $failures failure(s)"
  exit 1
fi
echo "check_recovery $mode: passed"
