package wire

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// inOne is what Each finds of field num (type bytes) in the message b.
func inOne(b []byte, num int) ([][]byte, error) {
	var out [][]byte
	err := Each(b, func(f Field) error {
		if int(f.Num) == num && f.Type == 2 {
			out = append(out, f.Bytes)
		}
		return nil
	})
	return out, err
}

// split cuts b at every cut (ascending offsets), as frames.
func split(b []byte, cuts ...int) [][]byte {
	var frames [][]byte
	prev := 0
	for _, c := range cuts {
		frames = append(frames, b[prev:c])
		prev = c
	}
	return append(frames, b[prev:])
}

// checkFrames fails when EachInFrames, on b cut in frames, reads a
// message Each does not or reads other values.
func checkFrames(t *testing.T, b []byte, cuts ...int) {
	t.Helper()
	var got [][]byte
	arena, err := EachInFrames(split(b, cuts...), 1, nil, func(v []byte) error {
		got = append(got, v)
		return nil
	})
	want, werr := inOne(b, 1)
	if err != nil {
		return // the caller takes the decoded path: never a different result
	}
	if werr != nil {
		t.Fatalf("EachInFrames(%x cut at %v) read a message Each refuses: %v", b, cuts, werr)
	}
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("EachInFrames(%x cut at %v) = %x, Each %x", b, cuts, got, want)
	}
	if len(arena) > len(b) {
		t.Fatalf("arena of %d bytes for a message of %d", len(arena), len(b))
	}
}

// Every entry of a list is read whole wherever the frames cut it: a
// tag, a length or a value across two or three frames.
func TestEachInFramesAtEveryCut(t *testing.T) {
	resp := &runtimeapi.ListContainersResponse{}
	for _, id := range []string{"c1", "c2", "c3"} {
		resp.Containers = append(resp.Containers, sampleContainer(id, runtimeapi.ContainerState_CONTAINER_RUNNING))
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(b); i++ {
		checkFrames(t, b, i)
		if i+3 < len(b) {
			checkFrames(t, b, i, i+1, i+3)
		}
	}
	var n int
	if _, err := EachInFrames(split(b, len(b)/2, len(b)/2), 1, nil, func(v []byte) error {
		c, err := PeekContainer(v)
		if err != nil || c.ID != resp.Containers[n].Id {
			t.Fatalf("entry %d: %+v %v", n, c, err)
		}
		n++
		return nil
	}); err != nil || n != 3 {
		t.Fatalf("%d entries, %v", n, err)
	}
	for _, bad := range [][]byte{{0x0a, 0x05, 1, 2}, {0x0a}, {0x00, 0x01}, {0x0b, 0x0c}, {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}} {
		if _, err := EachInFrames(split(bad, 1), 1, nil, func([]byte) error { return nil }); err == nil {
			t.Fatalf("%x: no error", bad)
		}
	}
}

func FuzzEachInFrames(f *testing.F) {
	l, _ := proto.Marshal(&runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		sampleContainer("c1", runtimeapi.ContainerState_CONTAINER_EXITED), sampleContainer("c2", runtimeapi.ContainerState_CONTAINER_RUNNING)}})
	f.Add(l, uint16(7), uint16(90))
	f.Add([]byte{0x0a, 0x02, 0x10, 0x01, 0x15, 1, 2, 3, 4, 0x09, 1, 2, 3, 4, 5, 6, 7, 8}, uint16(3), uint16(9))
	f.Fuzz(func(t *testing.T, b []byte, c1, c2 uint16) {
		a, z := min(int(c1), len(b)), min(int(c2), len(b))
		if a > z {
			a, z = z, a
		}
		checkFrames(t, b, a, z)
	})
}
