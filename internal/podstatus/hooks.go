package podstatus

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

var _ proxy.RunPodSandboxHook = (*Reporter)(nil)

// RunPodSandbox forwards the call and, once the sandbox exists, queues the
// pod's readiness gate and the events for its refused annotations.
func (r *Reporter) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return resp, err
	}
	md := req.GetConfig().GetMetadata()
	r.sandboxStarted(kubeapi.PodRef{Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid()}, req.GetConfig().GetAnnotations())
	return resp, nil
}
