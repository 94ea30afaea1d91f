package podtable

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

var (
	_ proxy.RunPodSandboxHook    = (*Table)(nil)
	_ proxy.StopPodSandboxHook   = (*Table)(nil)
	_ proxy.RemovePodSandboxHook = (*Table)(nil)
)

// The table is the first feature on the sandbox calls: it sees each answer
// last, after every other feature's own hook (a sandbox a feature rolled
// back is never added).

// RunPodSandbox admits the pod through the registered features (Admissions)
// and adds the sandbox the runtime created.
func (t *Table) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := t.adm.Run(ctx, req, next)
	if err == nil {
		t.added(resp.GetPodSandboxId(), req.GetRuntimeHandler(), req.GetConfig(), time.Now())
	}
	return resp, err
}

// StopPodSandbox marks the sandbox not ready once the runtime stopped it.
func (t *Table) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err == nil || proxy.NotFound(err) {
		t.stopped(req.GetPodSandboxId())
	}
	return resp, err
}

// RemovePodSandbox announces the sandbox gone once the runtime has removed
// it, or answers NotFound (which the kubelet takes as removed; also a
// NotFound of a later feature). A record that could not be removed fails the
// call with an error wrapping statefile.ErrNotDurable (Unavailable), and the
// kubelet's retry announces the sandbox gone again.
func (t *Table) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil && !proxy.NotFound(err) {
		return nil, err
	}
	if gerr := t.Gone(req.GetPodSandboxId()); gerr != nil {
		return nil, gerr
	}
	return resp, err
}
