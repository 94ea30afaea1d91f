package store

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

var _ proxy.RemovePodSandboxHook = (*Store)(nil)

// RemovePodSandbox is the lifecycle's hook on the CRI call that removes a
// sandbox: once the runtime has removed it, or answers NotFound (which the
// kubelet takes as removed; also a NotFound of a later feature), the sandbox
// is announced Gone to every feature. Listed first among the features, it
// sees the answer last, after every other feature's own hook. A record that
// could not be removed fails the call with an error wrapping
// statefile.ErrNotDurable (Unavailable), and the kubelet's retry announces
// the sandbox gone again.
func (s *Store) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil && status.Code(proxy.Status(err)) != codes.NotFound {
		return nil, err
	}
	if gerr := s.Gone(req.GetPodSandboxId()); gerr != nil {
		return nil, gerr
	}
	return resp, err
}
