package podstate

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestRestartCycleGoesThroughEveryPhase(t *testing.T) {
	ph := PhaseRunning
	for _, ev := range []Event{EventRuleMatched, EventStopped, EventSwapped} {
		to, ok := nextPhase(ph, ev)
		if !ok {
			t.Fatalf("%s does not apply in %s", ev, ph)
		}
		ph = to
	}
	if ph != PhaseRunning {
		t.Fatalf("a full cycle ends in %s", ph)
	}
}

func TestAbandonEndsEveryPhaseInRunning(t *testing.T) {
	for _, ph := range []Phase{PhaseRunning, PhaseTerminating, PhaseStartup} {
		if to, ok := nextPhase(ph, EventAbandoned); !ok || to != PhaseRunning {
			t.Errorf("abandoned in %s: %s, %v", ph, to, ok)
		}
	}
}

// A rule cannot match mid-restart, nor a swap happen before the stop.
func TestOutOfOrderEventsChangeNothing(t *testing.T) {
	for _, c := range []struct {
		ph Phase
		ev Event
	}{{PhaseTerminating, EventRuleMatched}, {PhaseStartup, EventRuleMatched}, {PhaseTerminating, EventSwapped}, {PhaseRunning, EventStopped}, {PhaseRunning, EventSwapped}} {
		if to, ok := nextPhase(c.ph, c.ev); ok {
			t.Errorf("%s in %s moved to %s", c.ev, c.ph, to)
		}
	}
}

func TestEveryPhaseWithAStepLeavesIt(t *testing.T) {
	for ph := range steps {
		left := false
		for _, to := range transitions[ph] {
			left = left || to != ph
		}
		if !left {
			t.Errorf("phase %s has a step but no way out", ph)
		}
	}
}

// A CreateContainer waiting for a restart is woken by the phase change
// itself.
func TestWaitIdleWakesAtThePhaseChange(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	done := make(chan error, 1)
	go func() { done <- k.m.waitIdle(context.Background(), sb) }()
	select {
	case err := <-done:
		t.Fatalf("waitIdle returned during the restart: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	k.m.mu.Lock()
	if err := k.m.abandon(k.m.pods[sb]); err != nil {
		t.Fatal(err)
	}
	k.m.mu.Unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitIdle not woken by the end of the restart")
	}
}

// With the event feed subscribed, waitFor asks the runtime again when the
// feed reports an exit, not at its safety-net interval.
func TestWaitForExitWakesOnTheEventFeed(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.m.EventsFrom(func() uint64 { return 1 })
	k.m.mu.Lock()
	k.m.pods[sb].Phase = PhaseStartup
	k.m.mu.Unlock()
	done := make(chan *runtimeapi.ContainerStatus, 1)
	go func() {
		s, err := k.m.waitFor(context.Background(), ids["sidecar"], true)
		if err != nil {
			t.Error(err)
		}
		done <- s
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	k.rt.exit(ids["sidecar"], 0)
	k.event(sb, ids["sidecar"], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	select {
	case s := <-done:
		if s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("waitFor returned %v", s.State)
		}
		if d := time.Since(start); d >= pollWithFeed/2 {
			t.Fatalf("woken after %s: by the safety-net poll, not the event", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitFor not woken")
	}
}
