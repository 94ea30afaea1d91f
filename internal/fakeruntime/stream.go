package fakeruntime

import (
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// streamBatch is how many items one message of a Stream* list carries
// (containerd 2.4.2 internal/cri/util/stream.go, DefaultStreamBatchSize).
const streamBatch = 5000

// sendInBatches sends items in messages of streamBatch, none for an empty
// list (util/stream.go, SendInBatches).
func sendInBatches[T any](items []*T, send func([]*T) error) error {
	for i := 0; i < len(items); i += streamBatch {
		if err := send(items[i:min(i+streamBatch, len(items))]); err != nil {
			return err
		}
	}
	return nil
}

// StreamContainers is ListContainers in batches (container_stream.go).
func (r *Runtime) StreamContainers(req *runtimeapi.StreamContainersRequest, s grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	l, err := r.ListContainers(s.Context(), &runtimeapi.ListContainersRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendInBatches(l.Containers, func(b []*runtimeapi.Container) error {
		return s.Send(&runtimeapi.StreamContainersResponse{Containers: b})
	})
}

// StreamPodSandboxes is ListPodSandbox in batches (sandbox_stream.go).
func (r *Runtime) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, s grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	l, err := r.ListPodSandbox(s.Context(), &runtimeapi.ListPodSandboxRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendInBatches(l.Items, func(b []*runtimeapi.PodSandbox) error {
		return s.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: b})
	})
}
