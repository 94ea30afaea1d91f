#!/usr/bin/env bash
# Paired A/B of cri-shim binaries under the backoff benchmark's CPU load: 20
# pods whose one container exits 1 at once, Restart rule, node maximum 1 s.
# One test node and kubelet; the shim binary alternates every window (A, B,
# A, B, ...), so drift of the machine hits both alike. Prints per window the
# restarts, the shim's CPU (share of a core and per restart) and the
# kubelet's, and how many ContainerStatus calls per restart were answered
# from kept exited statuses. A "binary" may be a script that execs one with
# other settings (e.g. GOMAXPROCS=4 exec /path/cri-shim "$@").
#   bench/ab-backoff.sh [-r ROUNDS] [-w SECONDS] BIN...     (root; make build first)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
. test/stack/env.sh
ROUNDS=3 WINDOW=40
while getopts r:w: o; do
	case $o in r) ROUNDS=$OPTARG ;; w) WINDOW=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
(($# >= 1)) || { echo "usage: $0 [-r ROUNDS] [-w SECONDS] BIN..." >&2; exit 2; }
for b in "$@"; do [[ -x $b ]] || { echo "$b: not executable" >&2; exit 2; }; done
BINS=()
for b in "$@"; do BINS+=("$(realpath "$b")"); done
# The node runs a copy, so the binaries under test can be rebuilt meanwhile.
RUNBIN=$(mktemp -d)/cri-shim
export CRI_SHIM_BIN=$RUNBIN
cp "${BINS[0]}" "$RUNBIN"
trap 'rm -f "$MANIFESTS"/ab-crash-*.yaml; test/stack/down.sh >/dev/null 2>&1 || true' EXIT
test/stack/up.sh --kubelet >/dev/null
printf '\n[backoff]\nmax_container_restart_period = 1\n' >>"$NODE_RUN/cri-shim/config.toml"

metric() { curl -s "http://$SHIM_METRICS/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s + 0}'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
swap() {
	local p
	p=$(cat "$NODE_RUN/cri-shim.pid")
	kill "$p"
	while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
	cp "$1" "$RUNBIN"
	test/stack/up.sh --start cri-shim >/dev/null
}
swap "${BINS[0]}"
for i in $(seq 1 20); do
	cat >"$MANIFESTS/ab-crash-$i.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ab-crash-$i
  namespace: default
  annotations:
    restart-rules.cri-shim.io/main: '[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]'
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "exit 1"]
YAML
done
sleep 30
hz=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
	for b in "${BINS[@]}"; do
		swap "$b"
		sleep 8
		sp=$(cat "$NODE_RUN/cri-shim.pid") kp=$(cat "$NODE_RUN/kubelet.pid")
		s0=$(ticks "$sp") k0=$(ticks "$kp") r0=$(metric cri_shim_container_restarts_total) u0=$(metric cri_shim_exited_status_reused_total)
		sleep "$WINDOW"
		s1=$(ticks "$sp") k1=$(ticks "$kp") r1=$(metric cri_shim_container_restarts_total) u1=$(metric cri_shim_exited_status_reused_total)
		awk -v n="$(basename "$b")" -v s=$((s1 - s0)) -v k=$((k1 - k0)) -v r=$((r1 - r0)) -v u=$((u1 - u0)) -v w="$WINDOW" -v hz="$hz" 'BEGIN {
			if (r < 1) r = 1
			printf "round %d %-20s restarts %4d (%.1f/s)  shim %.2f%% of a core, %.2f ms/restart  kubelet %.1f%%  reused statuses %.1f/restart\n",
				'"$r"', n, r, r / w, 100 * s / hz / w, 1000 * s / hz / r, 100 * k / hz / w, u / r }'
	done
done
