#!/usr/bin/env bash
# The end of a `go test -v` log, made readable: a timed-out run ends in
# thousands of goroutine stacks, and CI keeps only the tail of what is
# printed. Prints the CRIU in use, the counts, every failure, the tests that
# were running when the run timed out, and the slowest tests.
#   test/e2e-summary.sh LOG
set -uo pipefail
log=${1:?usage: e2e-summary.sh LOG}
[[ -f $log ]] || { echo "e2e-summary: no log $log" >&2; exit 0; }
echo "=== e2e summary ($log)"
if [[ -n ${CRI_SHIM_STACK:-} && -x $CRI_SHIM_STACK/bin/criu ]]; then
	echo "CRIU: $("$CRI_SHIM_STACK/bin/criu" --version 2>/dev/null | head -n1) ($(head -n2 "$CRI_SHIM_STACK/bin/criu" | tail -n1 | sed 's/^# //'))"
fi
echo "kernel: $(uname -r)"
# Top-level results only: subtests are indented.
pass=$(grep -c '^--- PASS' "$log")
fail=$(grep -c '^--- FAIL' "$log")
skip=$(grep -c '^--- SKIP' "$log")
echo "top-level tests: $pass passed, $fail failed, $skip skipped"
grep -E '^--- FAIL' "$log" || true
if grep -q '^panic: test timed out' "$log"; then
	grep -A20 '^panic: test timed out' "$log" | sed -n '1,/^$/p'
fi
echo "slowest tests:"
grep -E '^--- (PASS|FAIL)' "$log" | sed -E 's/^--- (PASS|FAIL): ([^ ]+) \(([0-9.]+)s\).*/\3 \1 \2/' |
	sort -rn | head -n 12 | awk '{printf "  %8.1fs %s %s\n", $1, $2, $3}'
awk '/^(ok|FAIL)[ \t]/ {print}' "$log"
