package podstate

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// crashOnce has the newest instance of main exit and be seen, and runs the
// restart's steps in the background; done reports their end.
func crashOnce(k kubelet, sb string, p *restartrecord.Pod) (done chan error) {
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur)
	done = make(chan error, 1)
	go func() { done <- runSteps(k.m, context.Background(), sb) }()
	return done
}

// atTheBacklogLimit is a crashing pod whose kubelet keeps one exited
// instance and has removed none: instances 1 to 5 of main exited, 6
// running. first is instance 1.
func atTheBacklogLimit(t *testing.T) (k kubelet, sb string, p *restartrecord.Pod, first string) {
	k, sb, p = crashingMainPod(t)
	k.m.opts.KeepDead = 1
	first = p.Latest["main"]
	for range 5 {
		if err := <-crashOnce(k, sb, p); err != nil {
			t.Fatal(err)
		}
	}
	return k, sb, p, first
}

// A restart does not create the next instance while the kubelet has not
// removed the exited ones it keeps no more (one, plus the one just replaced
// and three more): it goes on as soon as the kubelet removes one.
func TestRestartWaitsForTheKubeletsRemovals(t *testing.T) {
	k, sb, p, first := atTheBacklogLimit(t)
	created := len(k.created())
	done := crashOnce(k, sb, p) // 1 to 6 exited: one too many
	select {
	case err := <-done:
		t.Fatalf("the restart went on with 6 exited instances of main on record: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := len(k.created()); n != created {
		t.Fatalf("%d instances created while waiting", n-created)
	}
	removed := time.Now()
	k.remove(first)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the restart still waits after the kubelet removed an instance")
	}
	if took := time.Since(removed); took > time.Second {
		t.Fatalf("the restart went on %v after the removal", took)
	}
	if n := len(k.created()); n != created+1 || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("created %d, phase %s", n-created, p.Phase)
	}
	if n := testutil.ToFloat64(k.m.metrics.backlog); n != 1 {
		t.Fatalf("cri_shim_restart_backlog_waits_total = %v", n)
	}
}

// A kubelet that removes nothing slows restarts down to one per wait, not
// to none.
func TestRestartBacklogWaitIsBounded(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	k.m.opts.KeepDead = 1
	k.m.backlogWait = 200 * time.Millisecond
	for range 6 {
		if err := <-crashOnce(k, sb, p); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := <-crashOnce(k, sb, p); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || p.Phase != restartrecord.PhaseRunning || p.ContainerRestarts["main"] != 7 {
		t.Fatalf("restart took %v, phase %s, restarts %d; want about the 200 ms wait, then Running", took, p.Phase, p.ContainerRestarts["main"])
	}
}
