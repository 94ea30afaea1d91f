package podstate

import (
	"context"
	"os"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

const restartNotIn0 = `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`

// A container the orchestrator terminated stays terminated: its Restart rule
// (NotIn [0]) does not restart it, also after a shim restart, until the
// orchestrator restarts it; then the rule applies again.
func TestOrchestratorTerminatedContainerIsHeld(t *testing.T) {
	dir := t.TempDir()
	k := newKubelet(t, dir)
	k.rt.ExitOnStart("init", 0)
	ctx := context.Background()
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
	for _, n := range []string{"init", "sidecar", "main"} {
		k.start(sb, n)
	}
	main := k.m.pods.Get(sb).Latest["main"]
	// What pod management's TerminateContainer does: hold, then stop the
	// container on the runtime directly (not through the kubelet's route).
	if err := k.m.HoldContainer(ctx, sb, "main", true); err != nil {
		t.Fatal(err)
	}
	if _, err := k.cri.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: main}); err != nil {
		t.Fatal(err)
	}
	held := func(m *Manager, when string) {
		t.Helper()
		m.scan(ctx)
		if s := (kubelet{t: t, m: m, cri: k.cri}).status(main); s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("%s: the kubelet sees the terminated main as %v", when, s.State)
		}
		if p := m.pods.Get(sb); p.Phase != restartrecord.PhaseRunning || p.Trigger != nil || !p.Held["main"] {
			t.Fatalf("%s: phase %s, trigger %+v, held %v: the rule restarted a container the orchestrator terminated", when, p.Phase, p.Trigger, p.Held)
		}
	}
	held(k.m, "after the stop")
	// A restarted shim keeps the hold.
	k = k.restarted(dir)
	held(k.m, "after a shim restart")
	if n := len(k.created()); n != 3 {
		t.Fatalf("%d containers created, want 3 (no restart)", n)
	}
	// The orchestrator restarts it: in place, the exited instance not shown running again.
	if err := k.m.RestartContainer(ctx, sb, "main", "orchestrator"); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	if p.Scope != "main" || len(p.Held) != 0 {
		t.Fatalf("scope %q held %v, want a restart of main and no hold", p.Scope, p.Held)
	}
	if s := k.status(main); s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("the kubelet is shown the terminated instance as %v during the restart", s.State)
	}
	if err := runSteps(k.m, ctx, sb); err != nil {
		t.Fatal(err)
	}
	now := p.Latest["main"]
	if now == main || p.ContainerRestarts["main"] != 1 || k.container(now).State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after the command: main %s (was %s) state %v, restarts %v", now, main, k.container(now).State, p.ContainerRestarts)
	}
	// Released: the rule applies to its next exit again.
	k.exit(now, 1)
	k.m.scan(ctx)
	if p.Phase == restartrecord.PhaseRunning || p.Scope != "main" {
		t.Fatalf("phase %s scope %q: the rule no longer applies after the orchestrator's restart", p.Phase, p.Scope)
	}
}

// A hold that cannot be written is not in force (the caller then stops nothing).
func TestHoldNotWrittenIsNotHeld(t *testing.T) {
	dir := t.TempDir()
	k := newKubelet(t, dir)
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
	k.start(sb, "main")
	// Both slots unwritable (directories where the files go).
	for i := range uint64(2) {
		f := k.m.st.Slot(sb, i)
		os.Remove(f)
		if err := os.Mkdir(f, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.m.HoldContainer(context.Background(), sb, "main", true); err == nil {
		t.Fatal("a hold that could not be written was reported held")
	}
	if k.m.pods.Get(sb).Held["main"] {
		t.Fatal("an unwritten hold is in force in memory")
	}
	if err := k.m.HoldContainer(context.Background(), "nope", "main", true); err == nil {
		t.Fatal("held a container of an untracked pod")
	}
}
