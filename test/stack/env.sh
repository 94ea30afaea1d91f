# Paths of the test node, shared by up.sh, down.sh, the Makefile and the e2e tests.
# Everything lives in a scratch directory on private socket paths, so the test
# node never touches a containerd or kubelet the machine may already run.
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
STACK=${CRI_SHIM_STACK:-$REPO/.stack}
NODE_RUN=${CRI_SHIM_NODE_RUN:-/run/cri-shim-node}
NODE_DATA=${CRI_SHIM_NODE_DATA:-/var/lib/cri-shim-node}
CONTAINERD_SOCK=$NODE_RUN/containerd/containerd.sock
SHIM_SOCK=$NODE_RUN/cri-shim/cri-shim.sock
SHIM_METRICS=${CRI_SHIM_NODE_METRICS:-127.0.0.1:19464}
KUBELET_PORT=${CRI_SHIM_KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${CRI_SHIM_KUBELET_HEALTHZ_PORT:-10248}
MANIFESTS=$NODE_DATA/manifests
MANIFESTS_NATIVE=$NODE_DATA/manifests-native
SHIM_BIN=${CRI_SHIM_BIN:-$REPO/_output/cri-shim}
NODE_NAME=${CRI_SHIM_NODE_NAME:-cri-shim-node}
REGISTRY_ADDR=${CRI_SHIM_REGISTRY:-127.0.0.1:5000}
