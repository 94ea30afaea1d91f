# Paths of the test node, shared by up.sh, down.sh, the Makefile and the e2e tests.
# Everything lives in a scratch directory on private socket paths, so the test
# node never touches a containerd or kubelet the machine may already run.
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
STACK=${CRI_SHIM_STACK:-$REPO/.stack}
# The pair of the version matrix a node runs (install.sh builds the versions
# each make target uses, test/stack/versions.sh; up.sh links the chosen pair
# into the node's bin directory): the newest by default.
. "$REPO/test/stack/versions.sh"
CONTAINERD_VERSION=${CRI_SHIM_CONTAINERD_VERSION:-$CONTAINERD_NEWEST}
KUBELET_VERSION=${CRI_SHIM_KUBELET_VERSION:-$KUBELET_NEWEST}
# A lane is a whole test bed of its own on this machine (both nodes, the
# control plane, the registries): CRI_SHIM_LANE=N (1, the default, keeps the
# paths and ports below) shifts every path, port, bridge, pod subnet and
# cgroup root, so two runs (the newest pair and the oldest, or two halves of
# the suite) go side by side without sharing anything but the stack's files.
LANE=${CRI_SHIM_LANE:-1}
[[ $LANE =~ ^[1-9]$ ]] || { echo "env.sh: CRI_SHIM_LANE=$LANE: want 1 to 9" >&2; return 1 2>/dev/null || exit 1; }
LANE_SUFFIX=; LANE_PORT=$(((LANE - 1) * 1000))
[[ $LANE == 1 ]] || LANE_SUFFIX=-lane$LANE
NODE_RUN=${CRI_SHIM_NODE_RUN:-/run/cri-shim-node$LANE_SUFFIX}
NODE_DATA=${CRI_SHIM_NODE_DATA:-/var/lib/cri-shim-node$LANE_SUFFIX}
CONTAINERD_SOCK=$NODE_RUN/containerd/containerd.sock
SHIM_SOCK=$NODE_RUN/cri-shim/cri-shim.sock
SHIM_METRICS=${CRI_SHIM_NODE_METRICS:-127.0.0.1:$((19464 + LANE_PORT))}
KUBELET_PORT=${CRI_SHIM_KUBELET_PORT:-$((10250 + LANE_PORT))}
KUBELET_HEALTHZ_PORT=${CRI_SHIM_KUBELET_HEALTHZ_PORT:-$((10248 + LANE_PORT))}
MANIFESTS=$NODE_DATA/manifests
# The node's CNI bridge and pod subnet, and its kubelet's cgroupRoot (empty:
# the kubelet's default "/"). Each node on the machine needs its own.
CNI_BRIDGE=${CRI_SHIM_CNI_BRIDGE:-crishim$((2 * (LANE - 1)))}
POD_SUBNET=${CRI_SHIM_POD_SUBNET:-10.$((88 + 2 * (LANE - 1))).0.0/16}
CGROUP_ROOT=${CRI_SHIM_CGROUP_ROOT:-${LANE_SUFFIX:+/cri-shim$LANE_SUFFIX}}
MANIFESTS_NATIVE=$NODE_DATA/manifests-native
SHIM_BIN=${CRI_SHIM_BIN:-$REPO/_output/cri-shim}
# cri-shim's containerd runtime shim: the runtime_path of the runc handler,
# which restores the containers cri-shim marks (docs/restore-route.md).
RUNTIME_SHIM_BIN=${CRI_SHIM_RUNTIME_SHIM_BIN:-$REPO/_output/containerd-shim-cri-shim-v2}
NODE_NAME=${CRI_SHIM_NODE_NAME:-cri-shim-node}
REGISTRY_ADDR=${CRI_SHIM_REGISTRY:-127.0.0.1:$((5000 + LANE_PORT))}
# The same registry program over TLS (certificate by pki.sh), for checkpoint images.
REGISTRY_TLS_ADDR=${CRI_SHIM_REGISTRY_TLS:-127.0.0.1:$((5443 + LANE_PORT))}
# A third instance, over TLS too, that wants a login (htpasswd); its users'
# docker config.json files are in REGISTRY_AUTH_DIR (up.sh --start registry-auth).
REGISTRY_AUTH_ADDR=${CRI_SHIM_REGISTRY_AUTH:-127.0.0.1:$((5444 + LANE_PORT))}
REGISTRY_AUTH_DIR=${CRI_SHIM_REGISTRY_AUTH_DIR:-$NODE_RUN/registry-auth}
# Control plane (up.sh --apiserver / --start apiserver): private loopback ports.
ETCD_PORT=${CRI_SHIM_ETCD_PORT:-$((12379 + LANE_PORT))}
ETCD_PEER_PORT=${CRI_SHIM_ETCD_PEER_PORT:-$((12380 + LANE_PORT))}
APISERVER_PORT=${CRI_SHIM_APISERVER_PORT:-$((16443 + LANE_PORT))}
# The control plane's certificates; a second node (node2.sh) uses node 1's.
PKI=${CRI_SHIM_PKI:-$NODE_DATA/pki}
ADMIN_KUBECONFIG=$NODE_RUN/admin.kubeconfig
KUBELET_KUBECONFIG=$NODE_RUN/kubelet.kubeconfig
ROUTER_KUBECONFIG=$NODE_RUN/router.kubeconfig
ROUTER_METRICS=${CRI_SHIM_ROUTER_METRICS:-127.0.0.1:$((19102 + LANE_PORT))}
# The second node (node2.sh): its own paths, name, ports, bridge and
# cgroup root; its kubelet registers with the API server node 1 runs.
NODE2_RUN=${CRI_SHIM_NODE2_RUN:-/run/cri-shim-node2$LANE_SUFFIX}
NODE2_DATA=${CRI_SHIM_NODE2_DATA:-/var/lib/cri-shim-node2$LANE_SUFFIX}
NODE2_NAME=${CRI_SHIM_NODE2_NAME:-cri-shim-node2}
NODE2_METRICS=${CRI_SHIM_NODE2_METRICS:-127.0.0.1:$((19465 + LANE_PORT))}
NODE2_KUBELET_PORT=${CRI_SHIM_NODE2_KUBELET_PORT:-$((10260 + LANE_PORT))}
NODE2_KUBELET_HEALTHZ_PORT=${CRI_SHIM_NODE2_KUBELET_HEALTHZ_PORT:-$((10268 + LANE_PORT))}
NODE2_CNI_BRIDGE=${CRI_SHIM_NODE2_CNI_BRIDGE:-crishim$((2 * (LANE - 1) + 1))}
NODE2_POD_SUBNET=${CRI_SHIM_NODE2_POD_SUBNET:-10.$((89 + 2 * (LANE - 1))).0.0/16}
NODE2_CGROUP_ROOT=${CRI_SHIM_NODE2_CGROUP_ROOT:-/cri-shim-node2$LANE_SUFFIX}
# The node's own bin directory (up.sh): the stack's programs with the node's
# pair of containerd and kubelet, so lanes with other pairs never share one.
NODE_BIN=$NODE_RUN/bin
