package proxy

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"

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
	checkLargeList(t, unaryBytesIf(m, func() bool { return true }, hook), func(m string) { mode = m })
}

// A frames hook gets a large answer in several frames, and what it sends
// (the runtime's answer as it is, or bytes of its own) reaches the caller
// intact.
func TestFramesHook(t *testing.T) {
	const m = "/runtime.v1.RuntimeService/ListContainers"
	var mode string
	var frames atomic.Int32
	hook := func(ctx context.Context, req []byte, next FramesNext) ([]byte, bool, error) {
		fs, err := next(ctx, req)
		if err != nil {
			return nil, false, err
		}
		frames.Store(int32(len(fs)))
		resp := bytes.Join(fs, nil)
		switch mode {
		case "first entry":
			n, k := consumeVarint(resp[1:])
			return resp[:1+k+int(n)], false, nil
		case "own":
			return resp, false, nil
		}
		return nil, true, nil
	}
	checkLargeList(t, unaryFramesIf(m, func() bool { return true }, hook), func(m string) { mode = m })
	if frames.Load() < 2 {
		t.Fatalf("the answer came in %d frames", frames.Load())
	}
}

// checkLargeList lists a node of 300 containers (more than 64 KiB)
// through route, three times in each of the modes the hook knows (set by
// setMode), and compares each list with the runtime's.
func checkLargeList(t *testing.T, route hookRoute, setMode func(string)) {
	t.Helper()
	fx := newFixture(t, route)
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
		for _, mode := range []string{"as is", "first entry", "own", "as is"} {
			setMode(mode)
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

// within tells the parts of an answer from bytes of the hook's own.
func TestWithin(t *testing.T) {
	b := []byte{1, 2, 3, 4}
	b = b[:len(b):len(b)]
	for _, tc := range []struct {
		name string
		r    []byte
		want bool
	}{
		{"all of it", b, true},
		{"its end", b[2:], true},
		{"its middle", b[1:3], true},
		{"empty at its end", b[4:], false},
		{"a copy", []byte{1, 2, 3, 4}, false},
		{"nil", nil, false},
	} {
		if got := within(tc.r, b); got != tc.want {
			t.Errorf("%s: within = %v, want %v", tc.name, got, tc.want)
		}
	}
}
