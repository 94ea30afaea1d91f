package proxy

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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
	if got := metricValue(t, fx.mc, "cri_shim_grpc_errors_total", codes.FailedPrecondition.String(), "runtime.v1.RuntimeService/Version"); got != 1 {
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
