package podstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A Restart rule restarts only its container, on its own backoff curve; the
// other containers keep running and the kubelet never sees the exit.
func TestRestartRuleRestartsOneContainer(t *testing.T) {
	rt := newFakeRT()
	rt.exitOnStart["init"] = 0
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	ids := map[string]string{}
	for _, n := range []string{"init", "sidecar", "main"} {
		ids[n] = k.start(sb, n)
	}
	p := k.m.pods[sb]
	for i, wantDelay := range []time.Duration{testCurve.Delay(1), testCurve.Delay(2), testCurve.Delay(3)} {
		cur := p.Latest["main"]
		exited := time.Now()
		k.rt.exit(cur, 1)
		if s := k.status(cur); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("restart %d: the kubelet saw the exit: %v", i+1, s.State)
		}
		if p.Scope != "main" || p.Trigger.Delay != wantDelay {
			t.Fatalf("restart %d: scope %q delay %s, want main and %s", i+1, p.Scope, p.Trigger.Delay, wantDelay)
		}
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		// The executor waited out the delay, counted from the exit.
		if took := time.Since(exited); took < wantDelay {
			t.Fatalf("restart %d: replayed %s after the exit, before its backoff delay %s", i+1, took, wantDelay)
		}
		if p.Phase != PhaseRunning || p.ContainerRestarts["main"] != i+1 || p.Restarts != 0 {
			t.Fatalf("restart %d: phase %s, container restarts %v, pod restarts %d", i+1, p.Phase, p.ContainerRestarts, p.Restarts)
		}
	}
	if got := fmt.Sprint(rt.created[3:]); got != "[main main main]" {
		t.Fatalf("replayed %s, want only main, three times", got)
	}
	if len(rt.stopped) != 0 {
		t.Fatalf("stopped %v: a Restart rule must not touch other containers", rt.stopped)
	}
	if s, _ := rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["sidecar"]}); s.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatal("sidecar disturbed")
	}
	if a := rt.cs[p.Latest["main"]].Metadata.Attempt; a != 3 {
		t.Fatalf("third restart has attempt %d, want 3", a)
	}
}

// A container that crashes again at once is classified in the swap itself:
// the kubelet never sees the new instance's exit, even for an instant.
func TestInstantCrashAfterSwapIsClassifiedAtOnce(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	id := k.start(sb, "main")
	rt.exitOnStart["main"] = 1 // every replayed instance exits as soon as it starts
	rt.exit(id, 1)
	k.status(id)
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods[sb]
	newID := p.Latest["main"]
	if newID == id || p.Phase != PhaseTerminating || p.Trigger.ContainerID != newID {
		t.Fatalf("after the swap: phase %s, trigger %+v, latest %s", p.Phase, p.Trigger, newID)
	}
	if st := k.list()[newID]; st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the new instance's instant exit is visible to the kubelet: %v", st)
	}
	if p.Trigger.Delay != testCurve.Delay(2) {
		t.Fatalf("second restart delay %s, want %s", p.Trigger.Delay, testCurve.Delay(2))
	}
}

// Restarts on command (the pod management channel): a pod without rules,
// tracked because TrackAlso says so, restarts one container and then the
// whole pod through the same machinery as the rules.
func TestRestartOnCommand(t *testing.T) {
	rt := newFakeRT()
	rt.exitOnStart["init"] = 0
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	ctx := context.Background()
	// Untracked: refused.
	sb := k.runPod(map[string]string{"orchestrated": "yes"})
	if err := k.m.RestartPod(ctx, sb, "x"); err == nil {
		t.Fatal("an untracked pod was restarted")
	}
	k.m.TrackAlso(func(a map[string]string) bool { return a["orchestrated"] == "yes" })
	sb = k.runPod(map[string]string{"orchestrated": "yes"})
	for _, n := range []string{"init", "sidecar", "main"} {
		k.start(sb, n)
	}
	p := k.m.pods[sb]
	if err := k.m.RestartContainer(ctx, sb, "nope", "x"); err == nil {
		t.Fatal("restart of an unknown container accepted")
	}
	main := p.Latest["main"]
	if err := k.m.RestartContainer(ctx, sb, "main", "test"); err != nil {
		t.Fatal(err)
	}
	if s := k.status(main); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || p.Scope != "main" {
		t.Fatalf("after the command: kubelet sees %v, scope %q; want the restart under way", s.State, p.Scope)
	}
	if err := k.m.RestartPod(ctx, sb, "busy"); err == nil {
		t.Fatal("a second restart accepted while one is in progress")
	}
	if err := k.m.execute(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.ContainerRestarts["main"] != 1 || p.Restarts != 0 || len(p.Forced) != 0 {
		t.Fatalf("container restarts %v, pod restarts %d, forced %v", p.ContainerRestarts, p.Restarts, p.Forced)
	}
	if err := k.m.RestartPod(ctx, sb, "job restart"); err != nil {
		t.Fatal(err)
	}
	stopped := rt.stopped[len(rt.stopped)-1]
	if s := k.status(stopped); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || p.Scope != "" {
		t.Fatalf("after RestartPod: kubelet sees %v, scope %q; want a pod restart under way", s.State, p.Scope)
	}
	if err := k.m.execute(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.Restarts != 1 || p.Phase != PhaseRunning {
		t.Fatalf("pod restarts %d, phase %s", p.Restarts, p.Phase)
	}
}
