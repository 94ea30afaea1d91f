#!/usr/bin/env bash
# The version matrix: a named subset of the end-to-end suite on every pair of
# containerd and kubelet the stack builds (test/stack/install.sh), written to
# docs/compatibility.md (pair by feature, with the versions and the date).
#   test/matrix.sh [--containerd "2.2.9 2.4.2"] [--kubelet "1.37.2"] [--out FILE] [--lanes N]
# --lanes N runs N pairs at a time, each in a lane of its own (CRI_SHIM_LANE,
# test/stack/env.sh), from the caller's lane (1 by default) up.
# Needs root and the stack's builds of the pairs (make stack has every one;
# each missing one is named before anything runs). One run's logs:
# _output/matrix/.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
. test/stack/versions.sh
CONTAINERDS="${CONTAINERD_VERSIONS[*]}"
KUBELETS="${KUBELET_VERSIONS[*]}"
OUT=docs/compatibility.md
LANES=1
while (($#)); do
	case $1 in
	--containerd) CONTAINERDS=$2; shift ;;
	--kubelet) KUBELETS=$2; shift ;;
	--out) OUT=$2; shift ;;
	--lanes) LANES=$2; shift ;;
	*) echo "matrix.sh: unknown flag $1" >&2; exit 2 ;;
	esac
	shift
done
# feature | the tests that show it
FEATURES=(
	"CheckpointPod / RestorePod through a CRI client|TestCheckpointPodAndRestorePodThroughCRI"
	"restored container is the pod's own (a memory holder, hostile dump files, exec, logs, containerd restart)|TestRestoredContainerIsThePodsOwn"
	"warm start by annotation|TestWarmStartUnderKubelet"
	"restore by PodCheckpoint name|TestPodCheckpointCheckpointAndRestoreByName"
	"restore from an image reference on a second node|TestRestoreOnAnotherNode"
	"in-place restart|TestInPlaceRestartAllContainers"
	"backoff curve|TestBackoffDefaultCurve"
	"critest parity (shim = direct)|TestCritestThroughShimMatchesDirect"
	"pod status during an in-place restart (the condition's writer by kubelet)|TestPodStatusDuringInPlaceRestart"
	"checkpoint image push, pull, restore; containerd's own restore of it|TestCheckpointPushPullRestore"
	"the fake runtime answers as this containerd|TestFakeRuntimeMatchesContainerd"
)
run=""
for f in "${FEATURES[@]}"; do run+="${run:+|}${f#*|}"; done
logs=_output/matrix
mkdir -p "$logs"
declare -A cell
rc=0
first=${CRI_SHIM_LANE:-1}
((LANES >= 1 && first + LANES - 1 <= 9)) || { echo "matrix.sh: --lanes $LANES from lane $first: lanes 1 to 9 only" >&2; exit 2; }
pairs=()
for c in $CONTAINERDS; do for k in $KUBELETS; do pairs+=("$c/$k"); done; done
missing=$(for p in "${pairs[@]}"; do stack_missing "${CRI_SHIM_STACK:-$REPO/.stack}" "${p%/*}" "${p#*/}"; done | sort -u)
[[ -z $missing ]] || { while read -r m; do echo "matrix.sh: $m" >&2; done <<<"$missing"; exit 1; }
# pair C/K in lane L: its subset of the suite, its log, its time.
run_pair() {
	local c=${1%/*} k=${1#*/} lane=$2 log t0=$SECONDS
	log=$logs/containerd-$c-kubelet-$k.log
	echo "[matrix] containerd $c, kubelet $k (lane $lane): $log" >&2
	CRI_SHIM_LANE=$lane CRI_SHIM_CONTAINERD_VERSION=$c CRI_SHIM_KUBELET_VERSION=$k \
		go test -count=1 -v -timeout 60m -run "^($run)\$" ./test/e2e/ >"$log" 2>&1
	local r=$?
	echo "[matrix] containerd $c, kubelet $k: $((SECONDS - t0))s" >&2
	return $r
}
# Lane i takes pairs i, i+LANES, ...; the lanes run side by side.
for ((i = 0; i < LANES; i++)); do
	(
		r=0
		for ((j = i; j < ${#pairs[@]}; j += LANES)); do run_pair "${pairs[j]}" $((first + i)) || r=1; done
		exit $r
	) &
done
for ((i = 0; i < LANES; i++)); do wait -n || rc=1; done
for p in "${pairs[@]}"; do
	c=${p%/*} k=${p#*/}
	log=$logs/containerd-$c-kubelet-$k.log
	for f in "${FEATURES[@]}"; do
		t=${f#*|}
		if grep -q -- "^--- PASS: $t " "$log"; then cell[$c/$k/$t]=pass
		elif grep -q -- "^--- FAIL: $t " "$log"; then cell[$c/$k/$t]="**FAIL**"
		elif grep -q -- "^--- SKIP: $t " "$log"; then cell[$c/$k/$t]="skipped"
		else cell[$c/$k/$t]="not run"; fi
	done
done
{
	echo "# Compatibility"
	echo
	echo "Written by \`make matrix\` (test/matrix.sh) on $(date -u +%Y-%m-%d), cri-shim $(git describe --tags --always --dirty),"
	echo "each pair with the runtime's and kubelet's default configuration and feature gates, plus"
	echo "cri-shim's one containerd setting (the runc handler's \`runtime_path\`, [restore-route.md](restore-route.md))."
	echo "Each cell is the end-to-end test named in its column on that pair: pass, **FAIL**, skipped or not run."
	echo
	hdr="| containerd | kubelet |"; sep="| --- | --- |"
	for f in "${FEATURES[@]}"; do hdr+=" ${f%%|*} |"; sep+=" --- |"; done
	echo "$hdr"; echo "$sep"
	for c in $CONTAINERDS; do
		for k in $KUBELETS; do
			row="| $c | $k |"
			for f in "${FEATURES[@]}"; do row+=" ${cell[$c/$k/${f#*|}]} |"; done
			echo "$row"
		done
	done
	echo
	echo "Tests: $(for f in "${FEATURES[@]}"; do printf '`%s` ' "${f#*|}"; done)(test/e2e; [testing.md](testing.md))."
	echo
	echo "Kubelets: v1.34 has no native \`RestartAllContainers\` and v1.35 has it alpha and off by default, so with their default gates the shim's in-place restart is the only one on both and the shim writes \`AllContainersRestarting\` itself ([kubernetes-api.md](kubernetes-api.md#which-conditions-the-kubelet-keeps)); what else differs from v1.36 for the shim, with the kubelet source read for each, is in [in-place-restart.md](in-place-restart.md#kubelet-versions). Kubelet v1.38.0-beta.0 is not in the matrix: it needs Go 1.27 (\`GOTOOLCHAIN=go1.27.3\` serves that), and its build stops on two modules the Go module proxy refuses, \`sigs.k8s.io/structured-merge-diff/v7\` v7.0.1 and \`sigs.k8s.io/iptables-wrappers\` v1.0.0 (\`go build k8s.io/kubernetes/cmd/kubelet\`: \"reading .../@v/v7.0.1.zip: 403 Forbidden, server response: This module version is not available.\", the same for v1.0.0; tried on 2026-11-29)."
	echo
	echo "The restore's image check ([security.md](security.md)) knows two cgroup layouts. cgroup v1 (this test bed's hybrid host, the kubelet's cgroupfs driver, no cgroup namespace) ran on the real stack in every pair above, in each restore column and in the hostile-checkpoint tests. cgroup v2 (the unified hierarchy, a cgroup namespace, the systemd driver's paths) is checked with synthetic images only (\`TestCheckCgroup\`, \`TestCheckMountTree\` in internal/criucheck): the test bed has no cgroup v2 node yet. A checkpoint records its node's mode and restores only on a node of the same mode; on a v2 node the runtime shim refuses restores under runc older than 1.2."
} >"$OUT"
echo "[matrix] wrote $OUT" >&2
exit $rc
