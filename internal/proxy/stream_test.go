package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestUnknownBidiStreamForwarded(t *testing.T) {
	fx := newFixture(t)
	ctx := ctxT(t)
	cs, err := fx.shim.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/future.v1.Chat/Talk")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := cs.SendMsg(wrapperspb.String(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		var out wrapperspb.StringValue
		if err := cs.RecvMsg(&out); err != nil {
			t.Fatal(err)
		}
		if out.Value != fmt.Sprintf("re:%d", i) {
			t.Fatalf("got %q", out.Value)
		}
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(wrapperspb.StringValue)); !errors.Is(err, io.EOF) {
		t.Fatalf("want clean end, got %v", err)
	}
}

func TestServerStreamEndedByRuntimeKeepsItsStatus(t *testing.T) {
	fx := newFixture(t)
	sb, cfg := fx.runPod(t, 0, nil)
	want := []string{fx.addContainer(t, sb, cfg, "a", nil, false), fx.addContainer(t, sb, cfg, "b", nil, true)}
	s, err := runtimeapi.NewRuntimeServiceClient(fx.shim).StreamContainers(ctxT(t), &runtimeapi.StreamContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for {
		r, err := s.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != "fake: stream ended by runtime" {
				t.Fatalf("stream end status changed: %v", err)
			}
			break
		}
		ids = append(ids, r.Containers[0].Id)
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("got %v", ids)
	}
}

// The caller going away mid-stream must end the runtime's stream and leave no goroutine behind.
func TestStreamCancelledByCallerLeavesNothingBehind(t *testing.T) {
	fx := newFixture(t)
	// Warm up connections so their goroutines are part of the baseline.
	for _, cc := range []*grpc.ClientConn{fx.shim, fx.direct} {
		if _, err := runtimeapi.NewRuntimeServiceClient(cc).Version(ctxT(t), &runtimeapi.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	base := settledGoroutines(0)
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := runtimeapi.NewRuntimeServiceClient(fx.shim).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		fx.threeEvents(t, i)
		for range 3 {
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		waitFor(t, "the runtime's event stream to end", func() bool { return fx.rt.EventStreams() == 0 })
	}
	if n := settledGoroutines(base); n > base+2 {
		t.Fatalf("goroutines: %d before, %d after 20 cancelled streams", base, n)
	}
	if got := metricValue(t, fx.mc, "cri_shim_grpc_streams_in_flight", "runtime.v1.RuntimeService/GetContainerEvents"); got != 0 {
		t.Fatalf("in-flight stream gauge = %v after all streams ended", got)
	}
}

// The runtime going away mid-stream must end the caller's stream with an error.
func TestStreamEndsWhenRuntimeGoesAway(t *testing.T) {
	fx := newFixture(t)
	s, err := runtimeapi.NewRuntimeServiceClient(fx.shim).GetContainerEvents(ctxT(t), &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fx.threeEvents(t, 0)
	for range 3 {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	fx.rt.Stop()
	done := make(chan error, 1)
	go func() { _, err := s.Recv(); done <- err }()
	select {
	case err := <-done:
		if status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
			t.Fatalf("want Unavailable or Canceled, got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("caller's stream still open 5 s after the runtime went away")
	}
}

// settledGoroutines waits briefly for the goroutine count to drop to target.
func settledGoroutines(target int) int {
	n := runtime.NumGoroutine()
	for i := 0; i < 100 && n > target; i++ {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}
