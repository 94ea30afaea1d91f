#!/usr/bin/env bash
# The end-to-end suite in lanes: every test of test/e2e on the newest pair,
# and the matrix's subset on the oldest pair (test/matrix.sh), spread over N
# lanes that run side by side, each a whole test bed of its own
# (CRI_SHIM_LANE, test/stack/env.sh). Tests go to lanes longest first, each
# to the lane with the least work so far, by their durations in
# test/e2e/durations.txt. Every lane runs to its end whatever another does,
# and the summary lists each lane, each pair and every test that did not pass
# or did not run.
#   test/e2e-lanes.sh [--lanes N] [--first-lane N] [--tier fast|long] [--oldest CONTAINERD/KUBELET | --no-oldest] [--run REGEXP]
# --first-lane: the lanes used are N to N+lanes-1 (1 by default), beside
# whatever else uses lanes below N.
#   test/e2e-lanes.sh --plan        print which tests each lane would run, and stop
#   test/e2e-lanes.sh --durations   rewrite test/e2e/durations.txt from the last run's logs
# Needs root, the stack with both pairs (make e2e builds it) and make build's
# binaries. Logs:
# _output/e2e-lane<N>.log (newest pair), _output/matrix/ (oldest pair).
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
. test/stack/versions.sh
LANES=${CRI_SHIM_E2E_LANES:-3}
FIRST=1
TIER=${CRI_SHIM_E2E_TIER:-fast}
OLDEST=$CONTAINERD_OLDEST/$KUBELET_OLDEST
RUN=
PLAN=
DURATIONS=test/e2e/durations.txt
while (($#)); do
	case $1 in
	--lanes) LANES=$2; shift ;;
	--first-lane) FIRST=$2; shift ;;
	--tier) TIER=$2; shift ;;
	--oldest) OLDEST=$2; shift ;;
	--no-oldest) OLDEST= ;;
	--run) RUN=$2; shift ;;
	--plan) PLAN=1 ;;
	--durations)
		{
			sed -n '/^#/p' "$DURATIONS"
			cat _output/e2e-lane*.log 2>/dev/null | sed -nE 's/^--- (PASS|FAIL|SKIP): (Test[^ ]+) \(([0-9.]+)s\)$/\2 \3/p' |
				awk '{printf "%s %d\n", $1, $2 + 0.5}' | sort -k2,2nr -k1,1
			t=$(sed -nE 's/^\[matrix\] .*: ([0-9]+)s$/\1/p' _output/matrix/lanes.log 2>/dev/null | tail -n1)
			echo "oldest-pair ${t:-$(awk '$1 == "oldest-pair" {print $2}' "$DURATIONS")}"
		} >"$DURATIONS.new" && mv "$DURATIONS.new" "$DURATIONS"
		echo "wrote $DURATIONS" >&2
		exit 0
		;;
	*) echo "e2e-lanes.sh: unknown flag $1" >&2; exit 2 ;;
	esac
	shift
done
[[ $LANES =~ ^[1-9]$ && $FIRST =~ ^[1-9]$ ]] && ((FIRST + LANES - 1 <= 9)) ||
	{ echo "e2e-lanes.sh: --lanes $LANES --first-lane $FIRST: lanes 1 to 9 only" >&2; exit 2; }
[[ $TIER == fast || $TIER == long ]] || { echo "e2e-lanes.sh: --tier $TIER: want fast or long" >&2; exit 2; }
export CRI_SHIM_E2E_TIER=$TIER
# Both pairs built (make e2e builds them), or nothing runs.
if [[ -z $PLAN ]]; then
	missing=$(
		stack_missing "${CRI_SHIM_STACK:-$REPO/.stack}" "${CRI_SHIM_CONTAINERD_VERSION:-$CONTAINERD_NEWEST}" "${CRI_SHIM_KUBELET_VERSION:-$KUBELET_NEWEST}"
		[[ -z $OLDEST ]] || stack_missing "${CRI_SHIM_STACK:-$REPO/.stack}" "${OLDEST%/*}" "${OLDEST#*/}"
	)
	[[ -z $missing ]] || { while read -r m; do echo "e2e-lanes.sh: $m" >&2; done <<<"$missing"; exit 1; }
fi
mkdir -p _output/matrix
rm -f _output/e2e-lane*.log _output/e2e-lanes.status

# Every test of the package (no node needed to list them).
mapfile -t TESTS < <(go test -list '^Test' ./test/e2e/ | grep '^Test' | { if [[ -n $RUN ]]; then grep -E "$RUN"; else cat; fi })
((${#TESTS[@]})) || { echo "e2e-lanes.sh: no tests listed" >&2; exit 1; }

# Jobs, longest first, each to the lane with the least work.
declare -A weight
while read -r name secs; do
	[[ -z $name || $name == \#* ]] || weight[$name]=$secs
done <"$DURATIONS"
jobs=()
for t in "${TESTS[@]}"; do jobs+=("${weight[$t]:-20} $t"); done
[[ -z $OLDEST ]] || jobs+=("${weight[oldest-pair]:-300} oldest-pair")
declare -a load lanetests laneoldest
for ((l = 1; l <= LANES; l++)); do load[l]=0 lanetests[l]= laneoldest[l]=; done
# critest runs one lane at a time (a machine-wide lock: fixed host ports), so
# the newest pair's goes to the lane of the oldest pair's subset, which runs
# it too: the two follow each other instead of one lane waiting.
oldestlane=
while read -r w name; do
	best=1
	for ((l = 2; l <= LANES; l++)); do ((load[l] < load[best])) && best=$l; done
	if [[ $name == TestCritestThroughShimMatchesDirect && -n $oldestlane ]]; then best=$oldestlane; fi
	[[ $name != oldest-pair ]] || oldestlane=$best
	load[best]=$((load[best] + w))
	if [[ $name == oldest-pair ]]; then laneoldest[best]=1; else lanetests[best]+="${lanetests[best]:+|}$name"; fi
done < <(printf '%s\n' "${jobs[@]}" | sort -k1,1nr -k2,2 | awk '$2 == "oldest-pair" {print; next} {rest = rest $0 "\n"} END {printf "%s", rest}')

if [[ -n $PLAN ]]; then
	for ((l = 1; l <= LANES; l++)); do
		echo "lane $((FIRST + l - 1)) (${load[l]}s):${laneoldest[l]:+ oldest pair $OLDEST,} ${lanetests[l]//|/ }"
	done
	exit 0
fi

# lane N: the oldest pair's subset first (if it has it), then its tests on
# the newest pair; each part's outcome goes to _output/e2e-lanes.status.
lane() {
	local l=$1 n=$((FIRST + $1 - 1)) t0=$SECONDS rc
	if [[ -n ${laneoldest[l]} ]]; then
		local c=${OLDEST%/*} k=${OLDEST#*/}
		CRI_SHIM_LANE=$n test/matrix.sh --containerd "$c" --kubelet "$k" --out _output/compatibility-oldest.md \
			>>_output/matrix/lanes.log 2>&1
		rc=$?
		echo "lane $n: oldest pair containerd $c, kubelet $k: rc $rc in $((SECONDS - t0))s" >>_output/e2e-lanes.status
	fi
	if [[ -n ${lanetests[l]} ]]; then
		local t1=$SECONDS
		CRI_SHIM_LANE=$n go test -count=1 -v -timeout 40m -run "^(${lanetests[l]})\$" ./test/e2e/ >"_output/e2e-lane$n.log" 2>&1
		rc=$?
		echo "lane $n: newest pair, $(tr '|' '\n' <<<"${lanetests[l]}" | wc -l) tests: rc $rc in $((SECONDS - t1))s" >>_output/e2e-lanes.status
	fi
}
echo "[lanes] $TIER tier: ${#TESTS[@]} tests${OLDEST:+ and the oldest pair ($OLDEST)} in $LANES lanes from lane $FIRST (planned seconds: ${load[*]:1})" >&2
start=$SECONDS
for ((l = 1; l <= LANES; l++)); do lane "$l" & done
wait
echo "[lanes] all lanes done in $((SECONDS - start))s" >&2

# The summary: each lane, then every test without a pass.
rc=0
echo "=== e2e lanes ($TIER tier, $((SECONDS - start))s)"
sort _output/e2e-lanes.status
grep -q 'rc [1-9]' _output/e2e-lanes.status && rc=1
cat _output/e2e-lane*.log >_output/e2e.log 2>/dev/null
missing=()
for t in "${TESTS[@]}"; do
	grep -qE "^--- (PASS|FAIL|SKIP): $t " _output/e2e.log || missing+=("$t")
done
if ((${#missing[@]})); then
	echo "tests that never reported (not run, or the run died): ${missing[*]}"
	rc=1
fi
echo "skipped:"
# go test -v prints a top-level test's skip reason on the line before its "--- SKIP".
grep -hE -B1 '^--- SKIP' _output/e2e.log | grep -vE '^(--|--- SKIP|=== RUN)' | sed 's/^ */  /' | sort | uniq -c || true
test/e2e-summary.sh _output/e2e.log
if [[ -n $OLDEST ]]; then
	log=_output/matrix/containerd-${OLDEST%/*}-kubelet-${OLDEST#*/}.log
	echo "=== oldest pair ($OLDEST): $log"
	grep -E '^(--- |ok|FAIL)' "$log" 2>/dev/null || echo "  no results"
fi
# Last, where CI's tail keeps it: why each failed test failed.
oldestlog=${OLDEST:+_output/matrix/containerd-${OLDEST%/*}-kubelet-${OLDEST#*/}.log}
if grep -qE '^--- FAIL' _output/e2e.log $oldestlog 2>/dev/null; then
	echo "=== failures (each test's last lines)"
	test/e2e-failures.sh _output/e2e.log $oldestlog
fi
exit $rc
