package proxy

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Status and list hooks. The kubelet makes these calls most (its relist
// lists containers every second; a crash-looping container's status is read
// several times per restart), so besides the decoded form there are bytes
// hooks: the feature reads the encoded messages (protowire) and decodes only
// what it changes. A bytes hook forwards to the runtime, so it must be the
// last feature on its method (New refuses otherwise).

// ContainerStatusHook takes part in ContainerStatus on decoded messages.
type ContainerStatusHook interface {
	ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
		next UnaryNext[runtimeapi.ContainerStatusRequest, runtimeapi.ContainerStatusResponse]) (*runtimeapi.ContainerStatusResponse, error)
}

// ContainerStatusBytesHook gets the encoded request and returns the encoded
// response to send, which may be the runtime's own bytes.
type ContainerStatusBytesHook interface {
	ContainerStatusBytes(ctx context.Context, req []byte, next BytesNext) ([]byte, error)
}

// ListContainersFramesHook is ContainerStatusBytesHook for ListContainers,
// whose answer (a node's whole list, close to a megabyte at a thousand
// containers) it reads in the buffers it arrived in: it returns asIs to
// send the runtime's answer on, or resp, an answer of its own.
type ListContainersFramesHook interface {
	ListContainersFrames(ctx context.Context, req []byte, next FramesNext) (resp []byte, asIs bool, err error)
}

// PodSandboxStatusObserver is shown every PodSandboxStatus request, encoded,
// before it is forwarded raw. req is only valid during the call.
type PodSandboxStatusObserver interface {
	ObservePodSandboxStatus(req []byte)
}

func statusHooks() []binder {
	return []binder{
		bindUnary(ContainerStatus, ContainerStatusHook.ContainerStatus),
		bindBytes(ContainerStatus, ContainerStatusBytesHook.ContainerStatusBytes),
		bindFrames(ListContainers, ListContainersFramesHook.ListContainersFrames),
		{PodSandboxStatus, func(f any, active func() bool) (hookRoute, bool) {
			h, ok := f.(PodSandboxStatusObserver)
			if !ok {
				return hookRoute{}, false
			}
			return observeUnary(PodSandboxStatus.FullName(), orAlways(active), h.ObservePodSandboxStatus), true
		}},
	}
}

func always() bool { return true }

func orAlways(active func() bool) func() bool {
	if active == nil {
		return always
	}
	return active
}
