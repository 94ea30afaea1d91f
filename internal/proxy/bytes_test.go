package proxy

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A bytes hook's answers are pooled buffers: whatever it returns (the
// runtime's answer as it is, a part of it, its own bytes) reaches the
// caller intact, also when the next calls reuse those buffers. The list is
// large enough to arrive in many HTTP/2 data frames.
func TestBytesHookAnswersSurviveThePool(t *testing.T) {
	const m = "/runtime.v1.RuntimeService/ListContainers"
	var mode string
	hook := func(ctx context.Context, req []byte, next BytesNext) ([]byte, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		switch mode {
		case "first entry": // a part of the answer: its tag, length and value
			n, k := consumeVarint(resp[1:])
			return resp[:1+k+int(n)], nil
		case "own":
			return append(resp, resp[:0]...), nil
		}
		return resp, nil
	}
	fx := newFixture(t, unaryBytesIf(m, func() bool { return true }, hook))
	sb, cfg := fx.runPod(t, 1, nil)
	for i := range 300 {
		fx.addContainer(t, sb, cfg, fmt.Sprint("c", i), map[string]string{"io.kubernetes.pod.name": "p1", "padding": fmt.Sprintf("%0100d", i)}, i%2 == 0)
	}
	want, err := runtimeapi.NewRuntimeServiceClient(fx.direct).ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(want); n < 64<<10 {
		t.Fatalf("the list is %d bytes: too small to arrive in several frames", n)
	}
	c := runtimeapi.NewRuntimeServiceClient(fx.shim)
	for round := range 3 {
		for _, mode = range []string{"as is", "first entry", "own", "as is"} {
			got, err := c.ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{})
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, mode, err)
			}
			wantList := want.Containers
			if mode == "first entry" {
				wantList = wantList[:1]
			}
			if len(got.Containers) != len(wantList) {
				t.Fatalf("round %d, %s: %d containers, want %d", round, mode, len(got.Containers), len(wantList))
			}
			for i := range wantList {
				if !proto.Equal(got.Containers[i], wantList[i]) {
					t.Fatalf("round %d, %s: entry %d is %v, want %v", round, mode, i, got.Containers[i], wantList[i])
				}
			}
		}
	}
}

func consumeVarint(b []byte) (uint64, int) {
	var v uint64
	for i, c := range b {
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1
		}
	}
	return 0, len(b)
}

// take sends the runtime's answer itself, and a copy of a part of it.
func TestBytesCallTake(t *testing.T) {
	c := &bytesCall{}
	a := mem.NewBuffer(&[]byte{1, 2, 3, 4}, nil)
	c.got = append(c.got, a)
	b := a.ReadOnlyData()
	b = b[:len(b):len(b)]
	if buf, out := c.take(b[1:3]); buf != nil || &out[0] == &b[1] {
		t.Fatal("a part of the answer was not copied")
	}
	if buf, out := c.take([]byte{1, 2, 3, 4}); buf != nil || out[0] != 1 {
		t.Fatal("bytes of the hook's own were taken for the answer")
	}
	if buf, out := c.take(b); buf == nil || &buf.ReadOnlyData()[0] != &b[0] || &out[0] != &b[0] || len(c.got) != 0 {
		t.Fatal("the answer itself was not taken")
	}
}
