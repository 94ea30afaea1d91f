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
# The same registry program over TLS (certificate by pki.sh), for checkpoint images.
REGISTRY_TLS_ADDR=${CRI_SHIM_REGISTRY_TLS:-127.0.0.1:5443}
# Control plane (up.sh --apiserver / --start apiserver): private loopback ports.
ETCD_PORT=${CRI_SHIM_ETCD_PORT:-12379}
ETCD_PEER_PORT=${CRI_SHIM_ETCD_PEER_PORT:-12380}
APISERVER_PORT=${CRI_SHIM_APISERVER_PORT:-16443}
PKI=$NODE_DATA/pki
ADMIN_KUBECONFIG=$NODE_RUN/admin.kubeconfig
KUBELET_KUBECONFIG=$NODE_RUN/kubelet.kubeconfig
