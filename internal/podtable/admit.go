package podtable

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// Pod is a pod being admitted: the kubelet's request, and its annotations
// parsed once (podspec). Features read it; none changes it.
type Pod struct {
	Request *runtimeapi.RunPodSandboxRequest
	Spec    podspec.Spec
}

// Admission is a feature's part in one RunPodSandbox. Every field may be nil.
type Admission struct {
	// Commit runs once the runtime created the sandbox, in registration
	// order, and writes the feature's records durably. An error fails the
	// call: the features committed before are undone, the sandbox is
	// stopped and removed once, and the kubelet retries.
	Commit func(ctx context.Context, sandboxID string) error
	// Undo forgets what Commit recorded, when a later feature's commit failed.
	Undo func(sandboxID string)
	// Done runs when the call ends, whichever way: it releases what Admit
	// held for Commit.
	Done func()
}

// Admitter is a feature that takes part in the admission of every pod.
type Admitter interface {
	// Admit runs before the sandbox is created, in registration order. An
	// error refuses the pod: nothing is created and the call fails with it
	// (its errdefs class becomes the gRPC code, internal/proxy).
	Admit(ctx context.Context, p *Pod) (Admission, error)
}

// Remover is what the rollback of a failed admission calls on the runtime.
type Remover interface {
	StopPodSandbox(ctx context.Context, in *runtimeapi.StopPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.StopPodSandboxResponse, error)
	RemovePodSandbox(ctx context.Context, in *runtimeapi.RemovePodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error)
}

// Admissions are the features that admit pods, in order, and the runtime
// that removes a sandbox whose admission failed.
type Admissions struct {
	Features []Admitter
	RT       Remover
	Log      *slog.Logger
}

// Run is one RunPodSandbox through the features: each admits the pod, next
// creates the sandbox, each commits; a failed commit undoes those committed
// before (in reverse) and removes the sandbox under a fresh context (the
// caller's may be why it failed). The table's RunPodSandbox; feature tests
// call it with their own feature.
func (as Admissions) Run(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	p := &Pod{Request: req, Spec: podspec.Parse(req.GetConfig().GetAnnotations())}
	adm := make([]Admission, 0, len(as.Features))
	defer func() {
		for _, a := range adm {
			if a.Done != nil {
				a.Done()
			}
		}
	}()
	for _, f := range as.Features {
		a, err := f.Admit(ctx, p)
		adm = append(adm, a)
		if err != nil {
			return nil, err
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	id := resp.GetPodSandboxId()
	for i, a := range adm {
		if a.Commit == nil {
			continue
		}
		if err := a.Commit(ctx, id); err != nil {
			for j := i - 1; j >= 0; j-- {
				if adm[j].Undo != nil {
					adm[j].Undo(id)
				}
			}
			as.rollback(ctx, id, err)
			return nil, err
		}
	}
	return resp, nil
}

// rollback stops and removes a sandbox this call created, whose admission
// failed with why.
func (as Admissions) rollback(ctx context.Context, id string, why error) {
	as.Log.Error("pod table: a feature could not record the new sandbox; removing it, the kubelet retries", "sandbox", id, "err", why)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// The remove is tried even if the stop failed: containerd's
	// RemovePodSandbox stops what still runs.
	if _, err := as.RT.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		as.Log.Error("pod table: stopping the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
	if _, err := as.RT.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		as.Log.Error("pod table: removing the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
}
