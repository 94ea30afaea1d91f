package podmgmt

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// breakDir makes the pod records unwritable (a file where their bucket
// was), as a full or read-only disk would; restore puts it back.
func breakDir(t *testing.T, m *Manager, sb string) (restore func()) {
	t.Helper()
	dir := m.records.Dir()
	if err := os.Rename(dir, dir+".saved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		os.Remove(dir)
		if err := os.Rename(dir+".saved", dir); err != nil {
			t.Fatal(err)
		}
	}
}

// A record that cannot be written is not acted on: the call fails
// Unavailable (the kubelet retries) or the command FAILED, and nothing is
// stopped or started on its strength.
func TestUnwritableRecordsFailTheStep(t *testing.T) {
	f := newFx(t)
	ctx := context.Background()
	// RunPodSandbox: the sandbox is taken down again.
	if err := os.WriteFile(f.m.tokenDir("sb2"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runSandbox(t, f.m, f.rt, "sb2", 1234, false); status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("RunPodSandbox with an unwritable record: %v, want Unavailable", err)
	}
	if _, ok := f.rt.Sandbox("sb2"); f.m.get("sb2") != nil || ok || strings.Join(f.ops(), ",") != "stop sb2,remove sb2" {
		t.Fatalf("after a failed record: pod %v, at the runtime %v, runtime calls %v", f.m.get("sb2") != nil, ok, f.ops())
	}
	// TerminateContainer: nothing stopped, no exit code kept.
	f.run(t, "o1", "orch")
	f.run(t, "m1", "main")
	p := f.m.get("sb")
	term := &pb.Command{Command: &pb.Command_TerminateContainer{TerminateContainer: &pb.TerminateContainerCommand{ContainerName: "main", ExitCode: 3}}}
	restore := breakDir(t, f.m, "sb")
	if _, r := f.m.do(ctx, p, term); r.Result != pb.CommandResult_FAILED {
		t.Fatalf("terminate with an unwritable record: %v", r)
	}
	restore()
	f.r.holdErr = errors.New("disk full")
	if _, r := f.m.do(ctx, p, term); r.Result != pb.CommandResult_FAILED || !strings.Contains(r.ErrorDescription, "disk full") {
		t.Fatalf("terminate with an unwritable hold: %v", r)
	}
	f.r.holdErr = nil
	if len(f.stopped()) != 0 || len(p.Overrides) != 0 || f.m.overridden.Load() != 0 {
		t.Fatalf("after failed terminates: stopped %v, overrides %v", f.stopped(), p.Overrides)
	}
	// The hold comes before the stop.
	if _, r := f.m.do(ctx, p, term); r.Result != pb.CommandResult_ACCEPTED {
		t.Fatalf("terminate: %v", r)
	}
	if c := f.r.calls; len(c) != 1 || c[0] != "hold:main:true" || len(f.stopped()) != 1 {
		t.Fatalf("restarter calls %v, stopped %v", c, f.stopped())
	}
	// StopPodSandbox: Unavailable and not forwarded until the mark is written.
	restore = breakDir(t, f.m, "sb")
	forwarded := 0
	stopNext := func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
		forwarded++
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	if _, err := f.m.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "sb"}, stopNext); status.Code(proxy.Status(err)) != codes.Unavailable || forwarded != 0 {
		t.Fatalf("StopPodSandbox with an unwritable record: %v, forwarded %d", err, forwarded)
	}
	if !p.terminating.Load() {
		t.Fatal("not terminating in memory after a failed record")
	}
	restore()
	if _, err := f.m.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "sb"}, stopNext); err != nil || forwarded != 1 {
		t.Fatalf("retried StopPodSandbox: %v, forwarded %d", err, forwarded)
	}
	if m, err := New(f.rt.Client(), filepath.Dir(f.m.dir), openStore(t, filepath.Dir(f.m.dir)), nil, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil || !m.get("sb").terminating.Load() {
		t.Fatalf("the retried mark is not on disk: %v", err)
	}
}

func eventually(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
