#!/usr/bin/env bash
# Stops the test node started by up.sh: kubelet, then every pod, then cri-shim
# and containerd, and unmounts what they left. Safe to run when nothing runs.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
QUIET=
[[ ${1:-} == --quiet ]] && QUIET=1
log() { [[ -n $QUIET ]] || printf '[node] %s\n' "$*" >&2; }
export PATH=$STACK/bin:/usr/sbin:/usr/bin:/sbin:/bin

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

stop_pid kubelet
if [[ -S $CONTAINERD_SOCK ]] && crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" version >/dev/null 2>&1; then
	log "removing pods"
	crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 30s rmp -fa >/dev/null 2>&1
	crictl --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 30s rm -fa >/dev/null 2>&1
fi
stop_pid cri-shim
stop_pid containerd
stop_pid registry
stop_pid registry-tls
stop_pid kube-apiserver
stop_pid etcd
# runc shims outlive containerd; only ours (bound to our socket) are stopped.
pkill -KILL -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" 2>/dev/null
pkill -KILL -f "kubelet --config $NODE_RUN/kubelet.yaml" 2>/dev/null
# Unmount, deepest first, whatever the node left mounted.
awk -v a="$NODE_RUN" -v b="$NODE_DATA" '$2 ~ "^"a || $2 ~ "^"b {print $2}' /proc/self/mounts | sort -r |
	while read -r m; do umount -l "$m" 2>/dev/null; done
rm -rf "$NODE_RUN"
log "node down"
