#!/usr/bin/env bash
# train_fashion_mnist --resume on a checkpoint whose step no run of this length can reach (10^15,
# as a damaged or foreign checkpoint may hold) is refused at once, naming the checkpoint -- it used
# to step the scheduler 10^15 times. And a checkpoint within the run still resumes.
#
#   check_resume_bounds.sh <train_fashion_mnist>
set -uo pipefail
train=${1:?train_fashion_mnist}
root=${MG_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -e "$root/train-images-idx3-ubyte.gz" || -e "$root/train-images-idx3-ubyte" ]] ||
  { echo "SKIP: no Fashion-MNIST in $root"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/resume-bounds.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
flags=(--model mlp --limit-train 2 --limit-test 1 --device cpu --workers 0 --checkpoint-dir "$work/ckpt")

"$train" "${flags[@]}" --epochs 1 >"$work/first" 2>&1 || { cat "$work/first"; fail "the first run failed"; }
# Within the run (epoch 1, step 2 of 2 x 2): resumes.
timeout 60 "$train" "${flags[@]}" --epochs 2 --resume >"$work/ok" 2>&1 || { cat "$work/ok"; fail "resuming a good checkpoint failed"; }
grep -q "resumed from .* at epoch 1, step 2" "$work/ok" || fail "no 'resumed ... epoch 1, step 2' line"

# The step set to 10^15 in both files' metadata (the checksums, which a loader does not require, dropped).
python3 - "$work/ckpt" <<'PY'
import json, struct, sys, os
for name in ("model.safetensors", "optimizer.safetensors"):
    path = os.path.join(sys.argv[1], name)
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = {k: v for k, v in header.pop("__metadata__", {}).items() if not k.startswith("crc32c:")}
    meta["step"] = "1000000000000000"
    header = {k: v for k, v in header.items() if not k.startswith("crc32c:")}
    header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
start=$(date +%s)
timeout 60 "$train" "${flags[@]}" --epochs 2 --resume >"$work/out" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
((status == 124)) && fail "--resume at step 10^15 did not end within 60 s (the scheduler loop)"
((status != 0 && status != 124)) || fail "--resume at step 10^15 exited $status, want an error"
grep -q "step 1000000000000000, beyond what this run can reach" "$work/out" ||
  fail "no 'beyond what this run can reach' error: $(tail -n 3 "$work/out")"
echo "resume at step 10^15: status $status after ${elapsed} s: $(grep -o 'the checkpoint is at.*' "$work/out" | head -c 200)"

if ((failures > 0)); then
  echo "check_resume_bounds: $failures failure(s)"
  exit 1
fi
echo "check_resume_bounds: passed"
