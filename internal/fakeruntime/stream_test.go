package fakeruntime_test

import (
	"errors"
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// recvAll reads a stream to its end.
func recvAll[T any](t *testing.T, s grpc.ServerStreamingClient[T]) []*T {
	t.Helper()
	var out []*T
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
}

// The Stream* lists answer as the List calls, in one batch up to 5,000
// items and no message for an empty list; a Rewrite changes each message.
func TestStreamListsAsContainerd24(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	a, b := create(t, rt, sb, "a", 0), create(t, rt, sb, "b", 0)
	start(t, rt, a)
	s, err := rt.Client().StreamContainers(ctxT(t), &runtimeapi.StreamContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := recvAll(t, s)
	if len(msgs) != 1 || len(msgs[0].Containers) != 2 || msgs[0].Containers[0].Id != a || msgs[0].Containers[1].Id != b {
		t.Fatalf("StreamContainers: %v", msgs)
	}
	s, err = rt.Client().StreamContainers(ctxT(t), &runtimeapi.StreamContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED}}})
	if err != nil {
		t.Fatal(err)
	}
	if msgs := recvAll(t, s); len(msgs) != 0 {
		t.Fatalf("StreamContainers of no container sent %v", msgs)
	}
	rt.Rewrite("StreamPodSandboxes", func(m proto.Message) {
		for _, p := range m.(*runtimeapi.StreamPodSandboxesResponse).PodSandboxes {
			p.Annotations = map[string]string{"rewritten": "yes"}
		}
	})
	ps, err := rt.Client().StreamPodSandboxes(ctxT(t), &runtimeapi.StreamPodSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := recvAll(t, ps)
	if len(got) != 1 || len(got[0].PodSandboxes) != 1 || got[0].PodSandboxes[0].Id != sb || got[0].PodSandboxes[0].Annotations["rewritten"] != "yes" {
		t.Fatalf("StreamPodSandboxes: %v", got)
	}
	if l, _ := rt.Client().ListPodSandbox(ctxT(t), &runtimeapi.ListPodSandboxRequest{}); slices.ContainsFunc(l.Items, func(p *runtimeapi.PodSandbox) bool {
		return p.Annotations["rewritten"] != ""
	}) {
		t.Fatal("the stream's rewrite changed the runtime's state")
	}
}
