package proxy

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Sandbox lifecycle hooks. Each gets the kubelet's request and next, which
// forwards a (possibly changed) request to the next feature on the method
// or, for the last, to the runtime.

// RunPodSandboxHook takes part in RunPodSandbox; an error refuses the pod.
type RunPodSandboxHook interface {
	RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
		next UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error)
}

// StopPodSandboxHook takes part in StopPodSandbox.
type StopPodSandboxHook interface {
	StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
		next UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error)
}

// RemovePodSandboxHook takes part in RemovePodSandbox.
type RemovePodSandboxHook interface {
	RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
		next UnaryNext[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error)
}

func sandboxHooks() []binder {
	return []binder{
		bindUnary(RunPodSandbox, RunPodSandboxHook.RunPodSandbox),
		bindUnary(StopPodSandbox, StopPodSandboxHook.StopPodSandbox),
		bindUnary(RemovePodSandbox, RemovePodSandboxHook.RemovePodSandbox),
	}
}
