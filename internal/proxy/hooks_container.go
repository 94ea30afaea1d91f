package proxy

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Container lifecycle hooks (see hooks_sandbox.go for next).

// CreateContainerHook takes part in CreateContainer: it may change the
// request before next and the answer after it.
type CreateContainerHook interface {
	CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
		next UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error)
}

// StartContainerHook takes part in StartContainer.
type StartContainerHook interface {
	StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
		next UnaryNext[runtimeapi.StartContainerRequest, runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error)
}

// StopContainerHook takes part in StopContainer.
type StopContainerHook interface {
	StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest,
		next UnaryNext[runtimeapi.StopContainerRequest, runtimeapi.StopContainerResponse]) (*runtimeapi.StopContainerResponse, error)
}

// RemoveContainerHook takes part in RemoveContainer.
type RemoveContainerHook interface {
	RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
		next UnaryNext[runtimeapi.RemoveContainerRequest, runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error)
}

func containerHooks() []binder {
	return []binder{
		bindUnary(CreateContainer, CreateContainerHook.CreateContainer),
		bindUnary(StartContainer, StartContainerHook.StartContainer),
		bindUnary(StopContainer, StopContainerHook.StopContainer),
		bindUnary(RemoveContainer, RemoveContainerHook.RemoveContainer),
	}
}
