#!/usr/bin/env bash
# bench_dp_vs_ddp refuses a bad flag value before any run, with exit status 2 and one line naming
# the flag: --modes unknown or empty (was a SIGSEGV on an empty result list), --json to a path it
# cannot write (was "wrote ..." and 0), --bucket-cap-mb / --first-bucket-cap-mb / --sweep-buckets
# that are not a finite number of MB > 0 (inf was a JSON type error after the runs).
#
#   check_bench_dp_vs_ddp_flags.sh <bench_dp_vs_ddp>
bench=${1:?bench_dp_vs_ddp}
# shellcheck source=tests/check_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../check_lib.sh" check_bench_dp_vs_ddp_flags

# expect NAME MESSAGE -- flags...: exit status 2 within 20 s, MESSAGE in stderr, no "wrote".
expect() {
  local name=$1 message=$2 status
  shift 3
  timeout 20 "$bench" --model mlp --devices 2 --global-batch 8 --steps 1 --warmup 0 --device-type cpu "$@" \
    >"$work/out" 2>"$work/err"
  status=$?
  if ((status != 2)); then
    fail "$name: exit status $status, want 2"
    cat "$work/out" "$work/err"
    return
  fi
  grep -qF -- "$message" "$work/err" || { fail "$name: stderr lacks '$message': $(cat "$work/err")"; return; }
  grep -q "^wrote" "$work/out" && { fail "$name: printed 'wrote'"; return; }
  echo "ok: $name ($(head -n 1 "$work/err"))"
}

expect "--modes bogus" "unknown mode 'bogus'" -- --modes bogus
expect "--modes ''" "--modes must name at least one" -- --modes ""
expect "--modes dp,,ddp" "--modes has an empty item" -- --modes dp,,ddp
expect "--modes single,gpu" "unknown mode 'gpu'" -- --modes single,gpu
expect "--json into a missing directory" "--json: cannot write /proc/nope/x.json" -- --modes single --json /proc/nope/x.json
expect "--json a directory" "is a directory" -- --modes single --json "$work"
expect "--bucket-cap-mb inf" "--bucket-cap-mb must be a finite number" -- --modes single --bucket-cap-mb inf
expect "--bucket-cap-mb nan" "--bucket-cap-mb must be a finite number" -- --modes single --bucket-cap-mb nan
expect "--bucket-cap-mb 0" "--bucket-cap-mb must be a finite number" -- --modes single --bucket-cap-mb 0
expect "--bucket-cap-mb -1" "--bucket-cap-mb must be a finite number" -- --modes single --bucket-cap-mb -1
expect "--bucket-cap-mb 1e300" "--bucket-cap-mb must be a finite number" -- --modes single --bucket-cap-mb 1e300
expect "--first-bucket-cap-mb inf" "--first-bucket-cap-mb must be a finite number" -- --modes single --first-bucket-cap-mb inf
expect "--sweep-buckets 1,inf" "--sweep-buckets must be a finite number" -- --modes single --sweep-buckets 1,inf
# A good --json path is not left behind by the check (no run writes it here: the flags are bad).
expect "the probe leaves no file" "unknown mode 'x'" -- --modes x --json "$work/new.json"
[[ -e "$work/new.json" ]] && fail "the --json probe left $work/new.json behind"

check_done
