package podstate

import (
	"context"
	"fmt"
	"testing"

	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// recordingObserver notes what it hears, as "started main 88 RestartAllContainers".
type recordingObserver struct{ heard []string }

func (o *recordingObserver) RestartStarted(p restartapi.PodRef, t restartapi.Trigger) {
	o.heard = append(o.heard, fmt.Sprintf("started %s %s %d %s", p.Name, t.Container, t.ExitCode, t.Action))
}

func (o *recordingObserver) RestartEnded(p restartapi.PodRef, t restartapi.Trigger, out restartapi.Outcome) {
	o.heard = append(o.heard, fmt.Sprintf("ended %s %s %d", p.Name, t.Container, out))
}

// The observer hears a restart start when the rule matches and end when the
// new instances are shown.
func TestObserverHearsRestartStartAndEnd(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	o := &recordingObserver{}
	k.m.opts.Observer = o
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if got := fmt.Sprint(o.heard); got != "[started p main 88 RestartAllContainers]" {
		t.Fatalf("heard %s", got)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(o.heard); got != fmt.Sprintf("[started p main 88 RestartAllContainers ended p main %d]", restartapi.Restarted) {
		t.Fatalf("heard %s", got)
	}
}

// A restart given up because the pod is stopped ends as Abandoned; an exit
// that matches no rule is not heard.
func TestObserverHearsAbandonedRestart(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	o := &recordingObserver{}
	k.m.opts.Observer = o
	k.exit(ids["sidecar"], 1) // no rule
	k.status(ids["sidecar"])
	if len(o.heard) != 0 {
		t.Fatalf("heard %v for an exit without a rule", o.heard)
	}
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	k.m.mu.Lock()
	err := k.m.abandon(k.m.pods.Get(sb))
	k.m.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(o.heard); got != fmt.Sprintf("[started p main 88 RestartAllContainers ended p main %d]", restartapi.Abandoned) {
		t.Fatalf("heard %s", got)
	}
}

func TestSnapshotTellsRestartState(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	if s := k.m.Snapshot(); len(s) != 1 || s[0].Restarting || s[0].RestartedAll || s[0].Pod.UID != "uid-1" {
		t.Fatalf("before a restart: %+v", s)
	}
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if s := k.m.Snapshot(); len(s) != 1 || !s[0].Restarting || s[0].Trigger.ExitCode != 88 {
		t.Fatalf("during a restart: %+v", s)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if s := k.m.Snapshot(); len(s) != 1 || s[0].Restarting || !s[0].RestartedAll {
		t.Fatalf("after a restart: %+v", s)
	}
}
