#!/usr/bin/env bash
# Why each failed top-level test failed, from `go test -v` logs: the last
# messages (t.Log, t.Error, t.Fatal: their first lines, which name the test
# file and line) the test printed before its "--- FAIL". Printed last by the lanes' summary because CI keeps only the
# tail of the output.
#   test/e2e-failures.sh LOG...
set -uo pipefail
lines=${CRI_SHIM_FAILURE_LINES:-8}
for log in "$@"; do
	[[ -f $log ]] || continue
	awk -v keep="$lines" -v lf="$log" '
		# A top-level test starts (or resumes) its block; subtests stay in it.
		/^=== (RUN|CONT)   Test[^\/ ]+$/ { name = $3; n = 0; next }
		/^--- FAIL: Test/ {
			printf "--- FAIL: %s (%s)\n", $3, lf
			from = n > keep ? n - keep : 0
			for (i = from; i < n; i++) print "  " substr(buf[i % keep], 1, 240)
			n = 0; next
		}
		name != "" && /^ +[A-Za-z0-9_]+_test\.go:[0-9]+: / { buf[n % keep] = $0; n++ }
	' "$log"
done
