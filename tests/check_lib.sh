# Sourced by the tests' check_*.sh scripts: what each of them needs around its checks.
#
#   source "<path to>/tests/check_lib.sh" <name>
#
# gives $work (a scratch folder, removed at exit), fail MESSAGE (prints it and counts it) and
# check_done (exit 1 naming the count when anything failed, else "<name>: passed").
set -uo pipefail
check_name=${1:?check_lib.sh: a name}
work=$(mktemp -d "${TMPDIR:-/tmp}/$check_name.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check_done() {
  if ((failures > 0)); then
    echo "$check_name: $failures failure(s)"
    exit 1
  fi
  echo "$check_name: passed"
}
