package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/metrics"
	"github.com/cri-shim/cri-shim/internal/wire"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnaryResponseIdenticalToDirect(t *testing.T) {
	fx := newFixture(t)
	sb, cfg := fx.runPod(t, 0, nil)
	fx.addContainer(t, sb, cfg, "a", map[string]string{"k": "v"}, true)
	b := fx.addContainer(t, sb, cfg, "b", nil, true)
	if err := fx.rt.Exit(b, 2); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for _, req := range []*runtimeapi.ListContainersRequest{{}, {Filter: &runtimeapi.ContainerFilter{Id: b}}} {
		want, err := runtimeapi.NewRuntimeServiceClient(fx.direct).ListContainers(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := runtimeapi.NewRuntimeServiceClient(fx.shim).ListContainers(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(want, got) {
			t.Fatalf("through the shim %v, direct %v", got, want)
		}
		if len(req.GetFilter().GetId()) > 0 && len(got.Containers) != 1 {
			t.Fatalf("filter not forwarded: %v", got)
		}
	}
}

func TestErrorStatusPassesThroughUnchanged(t *testing.T) {
	fx := newFixture(t)
	ctx := ctxT(t)
	_, derr := runtimeapi.NewRuntimeServiceClient(fx.direct).Version(ctx, &runtimeapi.VersionRequest{Version: "fail"})
	_, serr := runtimeapi.NewRuntimeServiceClient(fx.shim).Version(ctx, &runtimeapi.VersionRequest{Version: "fail"})
	if derr == nil || serr == nil {
		t.Fatalf("want errors, got direct=%v shim=%v", derr, serr)
	}
	ds, ss := status.Convert(derr).Proto(), status.Convert(serr).Proto()
	if !proto.Equal(ds, ss) {
		t.Fatalf("status changed by the shim:\n direct %v\n shim   %v", ds, ss)
	}
	if len(ss.Details) != 1 {
		t.Fatalf("details lost: %v", ss)
	}
	if got := fx.mc.ErrorCount("/runtime.v1.RuntimeService/Version", codes.FailedPrecondition); got != 1 {
		t.Fatalf("error metric = %v, want 1", got)
	}
}

func TestMetadataAndDeadlineForwarded(t *testing.T) {
	fx := newFixture(t)
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "traceparent", "00-abc-def-01")
	if _, err := runtimeapi.NewRuntimeServiceClient(fx.shim).Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	md := *fx.sc.lastMD.Load()
	if got := md.Get("traceparent"); len(got) != 1 || got[0] != "00-abc-def-01" {
		t.Fatalf("metadata not forwarded: %v", md)
	}
	// The caller's deadline bounds the runtime call: a 200 ms deadline ends a 5 s call.
	dctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := runtimeapi.NewRuntimeServiceClient(fx.shim).Version(dctx, &runtimeapi.VersionRequest{Version: "slow"})
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 2*time.Second {
		t.Fatalf("deadline not carried: err=%v after %v", err, time.Since(start))
	}
}

func TestUnknownMethodForwardedToRuntime(t *testing.T) {
	fx := newFixture(t)
	ctx := ctxT(t)
	// A method the runtime knows and this build's cri-api does not.
	var out wrapperspb.StringValue
	if err := fx.shim.Invoke(ctx, "/runtime.v1.RuntimeService/FutureEcho", wrapperspb.String("x"), &out); err != nil {
		t.Fatalf("FutureEcho through the shim: %v", err)
	}
	if out.Value != "future:x" {
		t.Fatalf("got %q", out.Value)
	}
	// A method neither knows: the answer must be the runtime's, not the shim's.
	for _, m := range []string{"/runtime.v1.RuntimeService/NoSuchCall", "/no.such.Service/Call"} {
		derr := fx.direct.Invoke(ctx, m, wrapperspb.String("x"), &out)
		serr := fx.shim.Invoke(ctx, m, wrapperspb.String("x"), &out)
		if !proto.Equal(status.Convert(derr).Proto(), status.Convert(serr).Proto()) {
			t.Fatalf("%s: shim answered %v, runtime answered %v", m, serr, derr)
		}
		if !strings.Contains(status.Convert(serr).Message(), "fake runtime") {
			t.Fatalf("%s: answer did not come from the runtime: %v", m, serr)
		}
	}
}

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
	if got := fx.mc.StreamsInFlight("/runtime.v1.RuntimeService/GetContainerEvents"); got != 0 {
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

func TestRuntimeDownThenBack(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "runtime.sock")
	shim, _ := startProxy(t, sock)
	c := runtimeapi.NewRuntimeServiceClient(shim)
	start := time.Now()
	_, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("runtime absent: want Unavailable, got %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Unavailable took %v; must be prompt", d)
	}
	startRuntime(t, sock)
	waitFor(t, "the shim to reconnect by itself", func() bool {
		_, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{})
		return err == nil
	})
}

// No global lock: 16 calls must be inside the runtime at the same time.
func TestConcurrentCallsProceedConcurrently(t *testing.T) {
	const n = 16
	fx := newFixture(t)
	barrier(fx.rt, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := runtimeapi.NewRuntimeServiceClient(fx.shim).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("calls were serialised somewhere (barrier of %d never reached): %v", n, err)
		}
	}
}

func TestLargeResponseWithinKubeletLimit(t *testing.T) {
	// 2,000 containers of 4 KiB labels, 20 to a pod: a list of 8 to 9 MiB.
	fx := newFixture(t)
	const n = 2000
	labels := map[string]string{"io.kubernetes.pod.name": strings.Repeat("x", 4<<10)}
	var sb string
	var cfg *runtimeapi.PodSandboxConfig
	for i := range n {
		if i%20 == 0 {
			sb, cfg = fx.runPod(t, i, nil)
		}
		fx.addContainer(t, sb, cfg, fmt.Sprint("c", i), labels, false)
	}
	resp, err := runtimeapi.NewRuntimeServiceClient(fx.shim).ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if size := proto.Size(resp); size < 8<<20 || len(resp.Containers) != n {
		t.Fatalf("got %d containers, %d bytes", len(resp.Containers), size)
	}
}

func TestTypedRouteChangesOnlyItsMethod(t *testing.T) {
	route := unary("/runtime.v1.RuntimeService/Version",
		func(ctx context.Context, req *runtimeapi.VersionRequest, next UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
			resp, err := next(ctx, req)
			if err != nil {
				return nil, err
			}
			resp.RuntimeName += "+shim"
			return resp, nil
		})
	fx := newFixture(t, route)
	c := runtimeapi.NewRuntimeServiceClient(fx.shim)
	v, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{})
	if err != nil || v.RuntimeName != fakeruntime.RuntimeName+"+shim" {
		t.Fatalf("typed route not applied: %v %v", v, err)
	}
	if _, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "fail"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("typed route changed the runtime's error: %v", err)
	}
	if _, err := c.ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{}); err != nil {
		t.Fatal(err)
	}
}

// Two features on one method: the first route serves the call and its forward
// runs the second, whose forward reaches the runtime; an inactive UnaryIf in
// front still hands decoded messages on.
func TestRoutesForOneMethodAreChained(t *testing.T) {
	const m = "/runtime.v1.RuntimeService/Version"
	tag := func(s string) func(context.Context, *runtimeapi.VersionRequest, UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
		return func(ctx context.Context, req *runtimeapi.VersionRequest, next UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
			resp, err := next(ctx, req)
			if err != nil {
				return nil, err
			}
			resp.RuntimeName += s
			return resp, nil
		}
	}
	// Both UnaryIf and inactive: the call goes through raw, untouched.
	off := func() bool { return false }
	fx := newFixture(t, unaryIf(m, off, tag("+a")), unaryIf(m, off, tag("+b")))
	if v, err := runtimeapi.NewRuntimeServiceClient(fx.shim).Version(ctxT(t), &runtimeapi.VersionRequest{}); err != nil || v.RuntimeName != fakeruntime.RuntimeName {
		t.Fatalf("inactive chain: %q %v", v.GetRuntimeName(), err)
	}
	for _, active := range []bool{true, false} {
		outer := unaryIf(m, func() bool { return active }, tag("+outer"))
		fx := newFixture(t, outer, unary(m, tag("+inner")), unary(m, tag("+last")))
		c := runtimeapi.NewRuntimeServiceClient(fx.shim)
		v, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{})
		want := fakeruntime.RuntimeName + "+last+inner"
		if active {
			want += "+outer"
		}
		if err != nil || v.RuntimeName != want {
			t.Fatalf("active=%v: got %q, %v; want %q", active, v.GetRuntimeName(), err, want)
		}
		if _, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "fail"}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("active=%v: chain changed the runtime's error: %v", active, err)
		}
	}
}

func TestNewRefusesBadRoutes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "r.sock")
	backend, err := DialBackend(sock, BackendOptions{MaxRecvMsgSize: 1 << 20, MaxSendMsgSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	h := func(context.Context, grpc.ServerStream, grpc.ClientConnInterface) error { return nil }
	mc := metrics.New(CRIMethods())
	for name, routes := range map[string][]hookRoute{
		"not a CRI method": {{Method: "/x.Y/Z", Handler: h}},
		"duplicate":        {{Method: "/runtime.v1.RuntimeService/Version", Handler: h}, {Method: "/runtime.v1.RuntimeService/Version", Handler: h}},
		"nil handler":      {{Method: "/runtime.v1.RuntimeService/Version"}},
	} {
		if _, err := newWithRoutes(backend, mc, routes); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDialBackendRejectsRelativeEndpoint(t *testing.T) {
	for _, ep := range []string{"", "containerd.sock", "unix://relative.sock", "tcp://1.2.3.4:5"} {
		if _, err := DialBackend(ep, BackendOptions{}); err == nil {
			t.Errorf("%q accepted", ep)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
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

func TestBytesRoute(t *testing.T) {
	const m = "/runtime.v1.RuntimeService/Version"
	// Appends "+bytes" to runtime_name (field 2) by appending the field again:
	// the last occurrence wins for every reader.
	var calls atomic.Int32
	edit := func(ctx context.Context, req []byte, next BytesNext) ([]byte, error) {
		calls.Add(1)
		resp, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		name, _, err := wire.String(resp, 2)
		if err != nil {
			return nil, err
		}
		return protowire.AppendString(protowire.AppendTag(resp, 2, protowire.BytesType), name+"+bytes"), nil
	}
	tag := func(ctx context.Context, req *runtimeapi.VersionRequest, next UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		resp.RuntimeName += "+outer"
		return resp, nil
	}
	for _, tc := range []struct {
		name          string
		outer, active bool
		want          string
	}{
		{"alone, active", false, true, fakeruntime.RuntimeName + "+bytes"},
		{"alone, inactive", false, false, fakeruntime.RuntimeName},
		{"after an active typed route", true, true, fakeruntime.RuntimeName + "+bytes+outer"},
		{"after an inactive typed route", false, true, fakeruntime.RuntimeName + "+bytes"},
		{"typed route active, bytes inactive", true, false, fakeruntime.RuntimeName + "+outer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			routes := []hookRoute{unaryBytesIf(m, func() bool { return tc.active }, edit)}
			if strings.Contains(tc.name, "typed") {
				routes = append([]hookRoute{unaryIf(m, func() bool { return tc.outer }, tag)}, routes...)
			}
			fx := newFixture(t, routes...)
			c := runtimeapi.NewRuntimeServiceClient(fx.shim)
			v, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "v1"})
			if err != nil || v.RuntimeName != tc.want || v.Version == "" {
				t.Fatalf("got %q (version %q), %v; want %q", v.GetRuntimeName(), v.GetVersion(), err, tc.want)
			}
			if _, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "fail"}); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("the runtime's error changed: %v", err)
			}
		})
	}
	if calls.Load() == 0 {
		t.Fatal("the bytes route never ran")
	}
	// Its forward goes to the runtime: nothing may be chained after it.
	sock := filepath.Join(t.TempDir(), "r.sock")
	backend, err := DialBackend(sock, BackendOptions{MaxRecvMsgSize: 1 << 20, MaxSendMsgSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	if _, err := newWithRoutes(backend, metrics.New(CRIMethods()), []hookRoute{unaryBytesIf(m, func() bool { return true }, edit), unaryIf(m, func() bool { return true }, tag)}); err == nil {
		t.Fatal("a route chained after a bytes route was accepted")
	}
}

// threeEvents makes the runtime send three container events (a sandbox
// created, started and stopped) once the one event stream is open there.
func (fx *fixture) threeEvents(t *testing.T, n int) {
	t.Helper()
	waitFor(t, "the event stream to reach the runtime", func() bool { return fx.rt.EventStreams() == 1 })
	sb, _ := fx.runPod(t, n, nil)
	if _, err := fx.rt.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
}
