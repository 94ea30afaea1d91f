package podmgmt

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

func TestChannelEventsCommandsAndToken(t *testing.T) {
	f := newFx(t)
	// The declared container gets the token, read-only; others do not.
	req := f.run(t, "o1", "orch")
	if len(req.Config.Mounts) != 1 || req.Config.Mounts[0].ContainerPath != podmanagement.TokenPath || !req.Config.Mounts[0].Readonly ||
		req.Config.Mounts[0].HostPath != filepath.Join(f.m.dir, "sb", "token") {
		t.Fatalf("token mount: %v", req.Config.Mounts)
	}
	if r := f.run(t, "m1", "main"); len(r.Config.Mounts) != 0 {
		t.Fatalf("main got mounts %v", r.Config.Mounts)
	}
	sc, stop := f.sidecar(t, "")
	defer stop()
	// Current state first (resync), in time order, then nothing lost.
	got := map[string]pb.EventType{}
	for i := 0; i < 2; i++ {
		ev := next(t, sc)
		got[ev.ContainerName] = ev.Type
		if ev.Sequence != uint64(i+1) {
			t.Errorf("sequence %d, want %d", ev.Sequence, i+1)
		}
	}
	if got["orch"] != pb.EventType_STARTED || got["main"] != pb.EventType_STARTED {
		t.Fatalf("resync %v", got)
	}
	if ch := ReadChannels(filepath.Dir(f.m.dir)); len(ch) != 1 || ch[0].Container != "orch" || !strings.HasPrefix(ch[0].State, "connected") {
		t.Fatalf("cri-shim pods would show %+v", ch)
	}
	// An exit is delivered with its code.
	f.exit(t, "m1", 3)
	f.event(t, "m1", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	if ev := next(t, sc); ev.ContainerName != "main" || ev.Type != pb.EventType_EXITED || ev.ExitCode != 3 {
		t.Fatalf("exit event %v", ev)
	}
	// A restarted main: STARTED; then the orchestrator terminates it with 0.
	f.run(t, "m2", "main")
	if ev := next(t, sc); ev.ContainerName != "main" || ev.Type != pb.EventType_STARTED {
		t.Fatalf("start event %v", ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := sc.Terminate(ctx, "main", 0)
	if err != nil || r.Result != pb.CommandResult_ACCEPTED {
		t.Fatalf("terminate: %v %v", r, err)
	}
	if s := f.stopped(); len(s) == 0 || s[len(s)-1] != "m2" {
		t.Fatalf("stopped %v", s)
	}
	cs, err := f.m.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "m2"}, func(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
		return f.rt.Client().ContainerStatus(ctx, r)
	})
	if err != nil || cs.Status.ExitCode != 0 || cs.Status.Reason != "Completed" {
		t.Fatalf("the kubelet would see %v (%v), want exit 0 Completed", cs.GetStatus(), err)
	}
	// Refusals: unknown container, exited on its own, itself.
	f.direct(t, "j1", "job")
	f.exit(t, "j1", 1)
	for name, c := range map[string]*pb.Command{
		"unknown": {Command: &pb.Command_TerminateContainer{TerminateContainer: &pb.TerminateContainerCommand{ContainerName: "nope"}}},
		"exited":  {Command: &pb.Command_RestartContainer{RestartContainer: &pb.RestartContainerCommand{ContainerName: "job"}}},
		"itself":  {Command: &pb.Command_TerminateContainer{TerminateContainer: &pb.TerminateContainerCommand{ContainerName: "orch"}}},
	} {
		r, err := sc.Send(ctx, c)
		if err != nil || r.Result != pb.CommandResult_REFUSED || r.ErrorDescription == "" {
			t.Errorf("%s: %v %v, want REFUSED with a reason", name, r, err)
		}
	}
	// Restarts go to the restart machinery: of the container the
	// orchestrator terminated (held until then), of a running one, of the pod.
	if r, err := sc.Restart(ctx, "main"); err != nil || r.Result != pb.CommandResult_ACCEPTED {
		t.Fatalf("restart of the terminated main: %v %v", r, err)
	}
	f.direct(t, "m3", "main")
	if r, err := sc.Restart(ctx, "main"); err != nil || r.Result != pb.CommandResult_ACCEPTED {
		t.Fatalf("restart: %v %v", r, err)
	}
	if r, err := sc.RestartAll(ctx, "job restart"); err != nil || r.Result != pb.CommandResult_ACCEPTED {
		t.Fatalf("restart all: %v %v", r, err)
	}
	if c := f.r.restartCalls(); len(c) != 3 || c[0] != "container:main" || c[1] != "container:main" || c[2] != "pod:job restart" {
		t.Fatalf("restarter calls %v", c)
	}
	// A terminating pod refuses commands.
	if _, err := f.m.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "sb"}, func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, typ := f.m.do(ctx, f.m.get("sb"), &pb.Command{Command: &pb.Command_RestartAllContainers{RestartAllContainers: &pb.RestartAllContainersCommand{}}}); typ.Result != pb.CommandResult_REFUSED {
		t.Fatalf("terminating pod: %v", typ)
	}
}

// A sidecar restarted: the shim reconnects and resends the current state.
func TestReconnectResendsState(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	f.run(t, "m1", "main")
	sc, stop := f.sidecar(t, "")
	next(t, sc)
	next(t, sc)
	stop()
	f.exit(t, "m1", 7) // happens while it is down
	sc2, stop2 := f.sidecar(t, "")
	defer stop2()
	got := map[string]*pb.ContainerEvent{}
	for i := 0; i < 2; i++ {
		ev := next(t, sc2)
		got[ev.ContainerName] = ev
	}
	if e := got["main"]; e == nil || e.Type != pb.EventType_EXITED || e.ExitCode != 7 || e.Message != "resync" {
		t.Fatalf("after reconnect: %v", got)
	}
}

// A sidecar with another token rejects the shim's calls; nothing is delivered.
func TestWrongTokenRejected(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	sc, stop := f.sidecar(t, "not-the-token")
	defer stop()
	deadline := time.Now().Add(5 * time.Second)
	for sc.Rejected() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if sc.Rejected() == 0 {
		t.Fatal("the shim's calls were not rejected")
	}
	select {
	case ev := <-sc.Events():
		t.Fatalf("delivered %v to a sidecar with a wrong token", ev)
	case <-time.After(100 * time.Millisecond):
	}
}

// Nobody listens and the queue fills: CRI calls never wait, extra events are
// dropped and counted.
func TestNeverListeningSidecarDoesNotBlock(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	p := f.m.get("sb")
	start := time.Now()
	for i := 0; i < QueueSize+44; i++ {
		f.m.notify(p, &pb.ContainerEvent{ContainerName: "main"})
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("notify blocked for %s", d)
	}
	if got := p.dropped.Load(); got < 44 {
		t.Fatalf("dropped %d, want at least 44", got)
	}
	if st := p.state.Load().(string); st == "connected" {
		t.Fatalf("state %s with nobody listening", st)
	}
}

// A restarted shim keeps the channels of live sandboxes and drops the records
// of sandboxes removed meanwhile.
func TestRestartedShimReloadsChannels(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	f.m.stopConnector(f.m.get("sb")) // the first shim is gone
	dir := filepath.Dir(f.m.dir)
	os.MkdirAll(filepath.Join(f.m.dir, "gone"), 0o700)
	os.WriteFile(filepath.Join(f.m.dir, "gone", "pod.json"), []byte(`{"sandboxId":"gone","declaration":{"container":"orch","port":1,"version":"1.0"}}`), 0o600)
	os.WriteFile(filepath.Join(f.m.dir, "gone", "token"), []byte("t"), 0o444)
	m2, err := New(f.rt.Client(), dir, openStore(t, dir), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	m2.checkAddr = f.m.checkAddr
	runManager(t, m2, context.Background())
	if m2.get("sb") == nil || m2.get("gone") != nil {
		t.Fatalf("after restart: sb %v, gone %v", m2.get("sb") != nil, m2.get("gone") != nil)
	}
	if _, err := os.Stat(filepath.Join(f.m.dir, "gone")); !os.IsNotExist(err) {
		t.Fatalf("record of a removed sandbox kept: %v", err)
	}
	sc, stop := f.sidecar(t, "")
	defer stop()
	if ev := next(t, sc); ev.Message != "resync" {
		t.Fatalf("the restarted shim did not reconnect with the state: %v", ev)
	}
}
