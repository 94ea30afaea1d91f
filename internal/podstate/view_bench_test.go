package podstate

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// canned answers the runtime's encoded response without a runtime, so the
// benchmarks measure the view alone.
func canned(b *testing.B, resp proto.Message) proxy.BytesNext {
	out, err := proto.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	return func(context.Context, []byte) ([]byte, error) { return out, nil }
}

// BenchmarkStatusOfRunningInstance is the kubelet's most frequent call on a
// tracked pod: ContainerStatus of a running container (passed through).
func BenchmarkStatusOfRunningInstance(b *testing.B) {
	k, _, ids := setup(&testing.T{}, b.TempDir())
	st, _ := k.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]})
	next := canned(b, st)
	req, _ := proto.Marshal(&runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.m.ContainerStatusBytes(context.Background(), req, next); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelistOfTrackedPod is the PLEG's relist with one tracked pod of
// three containers (one exited init container).
func BenchmarkRelistOfTrackedPod(b *testing.B) {
	k, _, _ := setup(&testing.T{}, b.TempDir())
	l, _ := k.rt.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	next := canned(b, l)
	req, _ := proto.Marshal(&runtimeapi.ListContainersRequest{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.m.ListContainersBytes(context.Background(), req, next); err != nil {
			b.Fatal(err)
		}
	}
}
