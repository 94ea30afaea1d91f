package wire

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ListKeysOnly's codec gives every listed container's ID and sandbox ID,
// as proto decodes them, from an answer cut in buffers anywhere; other
// messages are refused, and a malformed answer is an error.
func TestListKeysOnly(t *testing.T) {
	var list runtimeapi.ListContainersResponse
	for i := range 40 {
		c := sampleContainer(fmt.Sprintf("c%02d", i), runtimeapi.ContainerState_CONTAINER_RUNNING)
		c.PodSandboxId = fmt.Sprintf("sb%d", i%3)
		list.Containers = append(list.Containers, c)
	}
	b, err := proto.Marshal(&list)
	if err != nil {
		t.Fatal(err)
	}
	codec := keysCodec{}
	for _, size := range []int{len(b), 64, 7} {
		var data mem.BufferSlice
		for rest := b; len(rest) > 0; {
			k := min(len(rest), size)
			data, rest = append(data, mem.SliceBuffer(rest[:k])), rest[k:]
		}
		var got runtimeapi.ListContainersResponse
		if err := codec.Unmarshal(data, &got); err != nil {
			t.Fatalf("buffers of %d: %v", size, err)
		}
		if len(got.Containers) != len(list.Containers) {
			t.Fatalf("buffers of %d: %d containers, want %d", size, len(got.Containers), len(list.Containers))
		}
		for i, c := range got.Containers {
			want := list.Containers[i]
			if c.Id != want.Id || c.PodSandboxId != want.PodSandboxId || c.Metadata != nil {
				t.Fatalf("buffers of %d, entry %d: %v, want the key of %v", size, i, c, want)
			}
		}
	}
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:len(b)-3])}, &runtimeapi.ListContainersResponse{}); err == nil {
		t.Fatal("a truncated answer was read")
	}
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &runtimeapi.ListPodSandboxResponse{}); err == nil {
		t.Fatal("another message was read as a container list")
	}
	req, err := codec.Marshal(&runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: "c01"}})
	if err != nil {
		t.Fatal(err)
	}
	var r runtimeapi.ListContainersRequest
	if err := proto.Unmarshal(req.Materialize(), &r); err != nil || r.GetFilter().GetId() != "c01" {
		t.Fatalf("request encoded as %v, %v", &r, err)
	}
}
