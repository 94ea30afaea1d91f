#!/usr/bin/env bash
# Printed by `make run`: waits for the demo pod and shows how to look at the node.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export PATH=$STACK/bin:$PATH
C="crictl --config $NODE_RUN/crictl.yaml"
for _ in $(seq 120); do
	$C ps --name main --state running -q 2>/dev/null | grep -q . && break
	sleep 1
done
echo
echo "=== cri-shim node is up ==="
echo "containerd  : $CONTAINERD_SOCK"
echo "cri-shim    : $SHIM_SOCK   (logs: $NODE_RUN/cri-shim.log)"
echo "kubelet     : https://127.0.0.1:$KUBELET_PORT  (logs: $NODE_RUN/kubelet.log)"
if [[ -f $ADMIN_KUBECONFIG ]]; then
	echo "API server  : https://127.0.0.1:$APISERVER_PORT  (logs: $NODE_RUN/kube-apiserver.log)"
fi
echo
$C pods
echo
$C ps -a
echo
echo "Look at it:"
echo "  export PATH=$STACK/bin:\$PATH"
echo "  crictl --config $NODE_RUN/crictl.yaml ps -a             # CRI through the shim"
echo "  crictl --config $NODE_RUN/crictl.yaml logs \$(crictl --config $NODE_RUN/crictl.yaml ps --name main -q)"
echo "  curl -sk https://127.0.0.1:$KUBELET_PORT/pods | head -c 600   # the kubelet's view"
if [[ -f $ADMIN_KUBECONFIG ]]; then
	echo "  kubectl --kubeconfig $ADMIN_KUBECONFIG get nodes,pods -A -o wide   # the API's view"
fi
echo "  curl -s http://$SHIM_METRICS/metrics | grep cri_shim_grpc_requests_total"
echo "  curl -s http://$SHIM_METRICS/readyz"
echo "Stop it: make stop"
