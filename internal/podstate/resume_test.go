package podstate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A shim killed mid-restart resumes from its state directory.
func TestResumeAfterCrash(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	// "kill -9": a new manager over the same state directory and runtime.
	m2 := newTestManager(t, k.rt, dir)
	p := m2.pods[sb]
	if p == nil || p.Phase != PhaseTerminating || p.Trigger.ContainerID != ids["main"] {
		t.Fatalf("state after restart of the shim: %+v", p)
	}
	if s, _ := m2.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]}); s.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatal("test setup")
	}
	k2 := kubelet{t: t, m: m2, rt: k.rt}
	if s := k2.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("resumed shim shows the trigger as %v", s.State)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m2.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m2.mu.Lock()
		ph := p.Phase
		m2.mu.Unlock()
		if ph == PhaseRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restart did not complete after resume: %s %s", ph, p.LastError)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	if n := len(k.rt.created); n != 6 {
		t.Fatalf("%d creates, want 3 + 3 (no duplicate restart)", n)
	}
}

// A shim killed after the runtime created a replayed container but before the
// state recorded it adopts that container instead of creating a second one.
func TestInterruptedReplayCreateIsAdopted(t *testing.T) {
	// started: the shim died after it had also started the instance (its
	// log file exists, so a recomputed restart count would be one higher);
	// it must still be adopted by the saved intent, not created again.
	for _, started := range []bool{false, true} {
		t.Run(fmt.Sprintf("started=%v", started), func(t *testing.T) {
			dir := t.TempDir()
			k, sb, ids := setup(t, dir)
			k.rt.exit(ids["main"], 88)
			k.status(ids["main"])
			p := k.m.pods[sb]
			// Simulate: the executor recorded its intent for init/1, the runtime created it, then the shim died.
			p.LogDirectory = t.TempDir()
			p.Phase, p.Creating = PhaseStartup, "init/1"
			k.m.save(p)
			orphan, _ := k.rt.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "init", Attempt: 1}}})
			if started {
				if _, err := k.rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: orphan.ContainerId}); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Join(p.LogDirectory, "init"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p.LogDirectory, "init", "1.log"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m2 := newTestManager(t, k.rt, dir)
			if err := m2.execute(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			inits := 0
			for _, n := range k.rt.created {
				if n == "init" {
					inits++
				}
			}
			if inits != 2 {
				t.Fatalf("init created %d times, want 2 (original + adopted orphan %s)", inits, orphan.ContainerId)
			}
			if got := m2.pods[sb].Latest["init"]; got != orphan.ContainerId || m2.pods[sb].Phase != PhaseRunning {
				t.Fatalf("latest init %s, phase %s; want the adopted %s, Running", got, m2.pods[sb].Phase, orphan.ContainerId)
			}
		})
	}
}

// The shim died during StartContainer of a replayed container; the runtime
// cancelled the start (exited, never started). The resumed shim creates it
// once more instead of reporting a failed init container.
func TestInterruptedReplayStartIsRetried(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	p := k.m.pods[sb]
	p.Phase = PhaseStartup
	resp, _ := k.rt.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "init", Attempt: 1}}})
	k.rt.exit(resp.ContainerId, 128) // StartError: StartedAt stays 0
	p.New = map[string]string{resp.ContainerId: "init"}
	p.IDs[resp.ContainerId] = "init"
	k.m.save(p)
	m2 := newTestManager(t, k.rt, dir)
	if err := m2.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(k.rt.created[4:]); got != "[init sidecar main]" {
		t.Fatalf("after an interrupted start the replay created %s, want init again then sidecar and main", got)
	}
	if _, still := k.rt.cs[resp.ContainerId]; still {
		t.Fatal("the interrupted instance was left for the kubelet to see")
	}
}
