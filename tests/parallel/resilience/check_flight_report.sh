#!/usr/bin/env bash
# Runs a flight_worker job whose ranks disagree, then scripts/flight-report on the dumps the ranks
# left, and checks that the report names the culprit:
#
#   tests/parallel/resilience/check_flight_report.sh <expected exit> <pattern>... -- <mpiexec ... flight_worker ...>
#
# Every rank must have written its dump (MG_FLIGHT_RECORDER_DIR, a fresh folder exported here; the
# mpiexec command should pass it on with -x), the report must exit with <expected exit> (1: a
# culprit, 0: the ranks agree) and print a line matching each <pattern> (grep -E).
set -uo pipefail

expected_exit=${1:?expected exit status}; shift
patterns=()
while [[ $# -gt 0 && "$1" != "--" ]]; do patterns+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
report="$here/../../../scripts/flight-report"

MG_FLIGHT_RECORDER_DIR="$(mktemp -d "${TMPDIR:-/tmp}/mg-flight.XXXXXX")"
export MG_FLIGHT_RECORDER_DIR
trap 'rm -rf "$MG_FLIGHT_RECORDER_DIR"' EXIT

timeout 40 "$@" 2>&1
job_status=$?
echo "job ended with status $job_status"
[[ $job_status -eq 124 ]] && { echo "FAIL: the job did not end within 40 s (a hang)"; exit 1; }

output=$(python3 "$report" "$MG_FLIGHT_RECORDER_DIR")
report_status=$?
echo "$output"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ls "$MG_FLIGHT_RECORDER_DIR"
[[ $report_status -eq $expected_exit ]] || fail "flight-report exited $report_status, expected $expected_exit"
grep -q "no dump from" <<<"$output" && fail "a rank left no dump"
for pattern in "${patterns[@]}"; do
  grep -Eq -- "$pattern" <<<"$output" || fail "the report has no line matching: $pattern"
done
if ((failures > 0)); then
  echo "check_flight_report: $failures failure(s)"
  exit 1
fi
echo "check_flight_report: the report named what it should"
