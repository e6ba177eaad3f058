#!/usr/bin/env bash
# train_gpt_parallel --strategy cp and --strategy ulysses print the losses --strategy ddp prints:
# at 2 ranks, at 4 ranks (one context group of 4) and at 4 ranks as a 2 x 2 mesh (--cp 2, with DDP
# and with FSDP over all 4 ranks: --cp-fsdp), as context over 2 x tensor pairs (--cp 2 --tp 2), and
# ring attention at 3 ranks, where the 64-byte windows do not split into 6 chunks and are padded.
# Each run trains 6 steps; the printed losses (steps 0 and 5) must agree to 1e-4 relative.
#
#   check_train_gpt_cp.sh <train_gpt_parallel> <mpiexec> [mpiexec flags...]
train_gpt=${1:?train_gpt_parallel}
mpiexec=${2:?mpiexec}
shift 2
# shellcheck source=tests/check_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../check_lib.sh" check_train_gpt_cp
export OMP_NUM_THREADS=1

# run NAME RANKS ARGS...: the "step N  loss X" lines of one run, in $work/NAME.
run() {
  local name=$1 ranks=$2
  shift 2
  if ! timeout 240 "$mpiexec" -n "$ranks" "$@" "$train_gpt" --steps 6 "${args[@]}" >"$work/$name.out" 2>&1; then
    fail "$name: exit status $?"
    tail -n 5 "$work/$name.out"
    return 1
  fi
  grep -E '^step +[0-9]+ +loss' "$work/$name.out" >"$work/$name"
}

# same NAME REFERENCE: NAME's losses equal REFERENCE's to 1e-4 relative.
same() {
  local verdict
  verdict=$(paste "$work/$1" "$work/$2" | awk '
    { a = $4; b = $8; d = a - b; if (d < 0) d = -d; if (d > 1e-4 * (b < 0 ? -b : b)) bad = bad " step " $2 ": " a " vs " b; n++ }
    END { if (n != 2) print "expected 2 losses, got " n; else if (bad != "") print bad; else print "ok" }')
  if [[ $verdict != ok ]]; then
    fail "$1 against $2: $verdict"
  else
    echo "ok: $1 = $2 ($(tr -s ' ' <"$work/$1" | cut -d' ' -f2,4 | paste -sd' '))"
  fi
}

mpi_flags=("$@")
for n in 2 4; do
  args=(--strategy ddp); run "ddp_np$n" "$n" "${mpi_flags[@]}" || continue
  args=(--strategy cp); run "cp_np$n" "$n" "${mpi_flags[@]}" && same "cp_np$n" "ddp_np$n"
  args=(--strategy ulysses); run "ulysses_np$n" "$n" "${mpi_flags[@]}" && same "ulysses_np$n" "ddp_np$n"
done
args=(--strategy cp --cp 2); run cp2_np4 4 "${mpi_flags[@]}" && same cp2_np4 ddp_np4
# The same mesh with FSDP sharding every parameter over all 4 ranks in place of DDP.
args=(--strategy cp --cp 2 --cp-fsdp); run cp2_fsdp_np4 4 "${mpi_flags[@]}" && same cp2_fsdp_np4 ddp_np4
# Tensor pairs x context over 2: ring attention on each rank's 2 of the 4 heads.
args=(--strategy cp --cp 2 --tp 2); run cp2_tp2_np4 4 "${mpi_flags[@]}" && same cp2_tp2_np4 ddp_np4
# 3 ranks: --batch 6 (divides by 3); the ring pads each 64-byte window to 66.
args=(--strategy ddp --batch 6); run ddp_np3 3 "${mpi_flags[@]}" &&
  { args=(--strategy cp --batch 6); run cp_np3 3 "${mpi_flags[@]}" && same cp_np3 ddp_np3; }
check_done
