#!/usr/bin/env bash
# A second test node on this machine, for restores on another node: its own
# containerd, cri-shim and kubelet, with their own root, state, sockets and
# ports (NODE2_* in env.sh), node name cri-shim-node2, CNI bridge crishim1 on
# 10.89.0.0/16 and kubelet cgroupRoot /cri-shim-node2 (both kubelets use
# cgroupfs; the kubelet removes pod cgroups under its own root it does not
# know, so two kubelets may not share one). Its kubelet registers with the
# API server node 1 runs (up.sh --apiserver, or --start apiserver), with a
# client certificate for system:node:cri-shim-node2 signed by node 1's CA.
#   node2.sh up [--shim-config FILE]   start it (FILE: TOML appended to its shim's config)
#   node2.sh down [--quiet]            stop it (node 1's down.sh does too)
# Its env file is $NODE2_RUN/env, as $NODE_RUN/env for node 1.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/env.sh"
# Node 1's, before the overrides: the control plane and the registries are
# shared, everything else is node 2's.
NODE1_RUN=$NODE_RUN
export CRI_SHIM_PKI=$PKI CRI_SHIM_APISERVER_PORT=$APISERVER_PORT CRI_SHIM_REGISTRY_AUTH_DIR=$REGISTRY_AUTH_DIR \
	CRI_SHIM_NODE_RUN=$NODE2_RUN CRI_SHIM_NODE_DATA=$NODE2_DATA CRI_SHIM_NODE_NAME=$NODE2_NAME \
	CRI_SHIM_NODE_METRICS=$NODE2_METRICS CRI_SHIM_KUBELET_PORT=$NODE2_KUBELET_PORT \
	CRI_SHIM_KUBELET_HEALTHZ_PORT=$NODE2_KUBELET_HEALTHZ_PORT \
	CRI_SHIM_CNI_BRIDGE=$NODE2_CNI_BRIDGE CRI_SHIM_POD_SUBNET=$NODE2_POD_SUBNET CRI_SHIM_CGROUP_ROOT=$NODE2_CGROUP_ROOT

case ${1:-} in
up)
	shift
	[[ -f $NODE1_RUN/env ]] || { echo "node2.sh: node 1 is not up (no $NODE1_RUN/env): run up.sh first" >&2; exit 1; }
	curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
		"https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null ||
		{ echo "node2.sh: node 1's API server does not answer on 127.0.0.1:$APISERVER_PORT: up.sh --start apiserver first" >&2; exit 1; }
	exec "$here/up.sh" --kubelet --join "$@"
	;;
down)
	shift
	"$here/down.sh" "$@"
	# Its bridge goes with it (node 1's stays, as it always has).
	ip link del "$CRI_SHIM_CNI_BRIDGE" 2>/dev/null || true
	;;
*)
	echo "usage: node2.sh up [--shim-config FILE] | down [--quiet]" >&2
	exit 2
	;;
esac
