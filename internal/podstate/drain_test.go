package podstate

import (
	"context"
	"testing"
	"time"
)

// The shim stopping (an in-place upgrade, a restart) while a restart's
// StartContainer is in the runtime: the call finishes, it is not cancelled
// (containerd would be left mid-start and refuse the next process's start),
// and Run returns once it has.
func TestRunEndsAfterTheRuntimeCallInProgress(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.startGate, k.rt.startHeld = make(chan struct{}), make(chan string, 8)
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.m.Run(ctx); close(done) }()
	var held string
	select {
	case held = <-k.rt.startHeld:
	case <-time.After(10 * time.Second):
		t.Fatal("the restart never reached a StartContainer")
	}
	cancel()
	select {
	case <-done:
		t.Fatal("Run ended while its StartContainer was still in the runtime")
	case <-time.After(200 * time.Millisecond):
	}
	close(k.rt.startGate)
	select {
	case <-done:
	case <-time.After(drainTimeout):
		t.Fatal("Run did not end after the call in progress finished")
	}
	k.rt.mu.Lock()
	s := k.rt.cs[held]
	started := s != nil && s.StartedAt != 0
	k.rt.mu.Unlock()
	if !started {
		t.Fatalf("the start of %s was cut short", held)
	}
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if p := k.m.pods[sb]; p.Phase != PhaseStartup {
		t.Fatalf("phase %s after the stop, want Startup (resumed by the next process)", p.Phase)
	}
}
