#!/usr/bin/env bash
# Stops the test node started by up.sh: kubelet, then every pod, then cri-shim
# and containerd, and unmounts what they left. Safe to run when nothing runs.
# Node 1's also stops the second node (node2.sh) first: it is registered
# with node 1's API server and would be left behind otherwise.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
QUIET=
[[ ${1:-} == --quiet ]] && QUIET=1
log() { [[ -n $QUIET ]] || printf '[node] %s\n' "$*" >&2; }
export PATH=$NODE_BIN:$STACK/bin:/usr/sbin:/usr/bin:/sbin:/bin

stop_pid() { # stop_pid NAME: SIGTERM, then SIGKILL after 10 s
	local f=$NODE_RUN/$1.pid pid
	[[ -f $f ]] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		log "stopping $1 ($pid)"
		kill -TERM "$pid" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$pid" 2>/dev/null
	fi
	rm -f "$f"
}

if [[ $NODE_RUN != "$NODE2_RUN" && -f $NODE2_RUN/env ]]; then
	"$(dirname "${BASH_SOURCE[0]}")/node2.sh" down ${QUIET:+--quiet}
fi
stop_pid kubelet
if [[ -S $CONTAINERD_SOCK ]] && crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" version >/dev/null 2>&1; then
	log "removing pods"
	# One rmp -fa can run out of time with a thousand containers (the proxy
	# bench); pods left in containerd's store keep their names reserved
	# for the next run. So again while any is left, a few times.
	for _ in 1 2 3 4 5; do
		crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 30s rmp -fa >/dev/null 2>&1
		crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 30s rm -fa >/dev/null 2>&1
		[[ -z $(crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" pods -q 2>/dev/null) ]] && break
	done
fi
stop_pid cri-shim
stop_pid containerd
stop_pid registry
stop_pid registry-tls
stop_pid registry-auth
stop_pid cri-shim-router
stop_pid kube-apiserver
stop_pid etcd
# Runtime shims (runc's, and cri-shim's own) outlive containerd, and the
# containers under a shim outlive it: each of ours (bound to our socket) is
# stopped with its process tree.
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
for pid in $(pgrep -f "containerd-shim-(runc|cri-shim)-v2 .*-address $CONTAINERD_SOCK"); do
	kill -KILL "$pid" $(descendants "$pid") 2>/dev/null
done
pkill -KILL -f "kubelet --config $NODE_RUN/kubelet.yaml" 2>/dev/null
# Unmount, deepest first, whatever the node left mounted (under its own
# directories only: /run/cri-shim-node is a prefix of node 2's /run/cri-shim-node2).
awk -v a="$NODE_RUN" -v b="$NODE_DATA" '$2 ~ "^"a"(/|$)" || $2 ~ "^"b"(/|$)" {print $2}' /proc/self/mounts | sort -r |
	while read -r m; do umount -l "$m" 2>/dev/null; done
# The kubelet's own cgroupRoot (node 2's), deepest first, once its pods are
# gone: in every hierarchy, the hybrid host's unified one included (runc
# makes the pods' cgroups there too).
if [[ -n $CGROUP_ROOT && $CGROUP_ROOT != / ]]; then
	awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts | while read -r mp; do
		[[ -d $mp$CGROUP_ROOT ]] && find "$mp$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
	done
fi
rm -rf "$NODE_RUN"
log "node down"
