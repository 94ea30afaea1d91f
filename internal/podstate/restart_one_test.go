package podstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// A Restart rule restarts only its container, on its own backoff curve; the
// other containers keep running and the kubelet never sees the exit.
func TestRestartRuleRestartsOneContainer(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	k.rt.ExitOnStart("init", 0)
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	ids := map[string]string{}
	for _, n := range []string{"init", "sidecar", "main"} {
		ids[n] = k.start(sb, n)
	}
	p := k.m.pods.Get(sb)
	for i, wantDelay := range []time.Duration{testCurve.Delay(1), testCurve.Delay(2), testCurve.Delay(3)} {
		cur := p.Latest["main"]
		exited := time.Now()
		k.exit(cur, 1)
		if s := k.status(cur); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("restart %d: the kubelet saw the exit: %v", i+1, s.State)
		}
		if p.Scope != "main" || p.Trigger.Delay != wantDelay {
			t.Fatalf("restart %d: scope %q delay %s, want main and %s", i+1, p.Scope, p.Trigger.Delay, wantDelay)
		}
		if err := runSteps(k.m, context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		// The executor waited out the delay, counted from the exit.
		if took := time.Since(exited); took < wantDelay {
			t.Fatalf("restart %d: replayed %s after the exit, before its backoff delay %s", i+1, took, wantDelay)
		}
		if p.Phase != restartrecord.PhaseRunning || p.ContainerRestarts["main"] != i+1 || p.Restarts != 0 {
			t.Fatalf("restart %d: phase %s, container restarts %v, pod restarts %d", i+1, p.Phase, p.ContainerRestarts, p.Restarts)
		}
	}
	if got := fmt.Sprint(k.created()[3:]); got != "[main main main]" {
		t.Fatalf("replayed %s, want only main, three times", got)
	}
	if stopped := k.stopped(); len(stopped) != 0 {
		t.Fatalf("stopped %v: a Restart rule must not touch other containers", stopped)
	}
	if s := k.container(ids["sidecar"]); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatal("sidecar disturbed")
	}
	if a := k.container(p.Latest["main"]).Metadata.Attempt; a != 3 {
		t.Fatalf("third restart has attempt %d, want 3", a)
	}
}

// A container that crashes again at once is classified in the swap itself:
// the kubelet never sees the new instance's exit, even for an instant.
func TestInstantCrashAfterSwapIsClassifiedAtOnce(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	id := k.start(sb, "main")
	k.rt.ExitOnStart("main", 1) // every replayed instance exits as soon as it starts
	k.exit(id, 1)
	k.status(id)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	newID := p.Latest["main"]
	if newID == id || p.Phase != restartrecord.PhaseTerminating || p.Trigger.ContainerID != newID {
		t.Fatalf("after the swap: phase %s, trigger %+v, latest %s", p.Phase, p.Trigger, newID)
	}
	if st := k.list()[newID]; st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the new instance's instant exit is visible to the kubelet: %v", st)
	}
	if p.Trigger.Delay != testCurve.Delay(2) {
		t.Fatalf("second restart delay %s, want %s", p.Trigger.Delay, testCurve.Delay(2))
	}
}

// After a sync the kubelet relists the one pod (pleg/generic.go relistPod: a
// label-filtered list) and then reads the status of each listed container,
// seconds later under load. A swap in between must keep the listed picture as
// it does for the global relist: the old instance read exited with the new
// one unseen is a terminated container the kubelet's status manager then
// refuses to see running again.
func TestStatusAfterSwapHoldsAPodRelistPicture(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	old := k.start(sb, "main")
	k.exit(old, 1)
	if got := k.listPod("uid-1"); len(got) != 1 || got[old] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod relist during the restart: %v, want only the old instance, running", got)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	// The read of that relist's pod status, after the swap.
	if s := k.readPod(sb, old)[old]; s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("status after the swap, in the read of the list before it: %v/%d, want running as listed", s.State, s.ExitCode)
	}
	// The next read begins: that list was read. The list after shows the old
	// instance's real end, and the read after it too.
	k.readPod(sb)
	if got := k.listPod("uid-1"); got[old] != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("pod relist after the read: %v, want the old instance exited", got)
	}
	if s := k.readPod(sb, old)[old]; s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 {
		t.Fatalf("status in the next read: %v/%d, want exited 1", s.State, s.ExitCode)
	}
}

// The kubelet reads pods as one list and then, seconds later under load,
// the status of each listed container (after the pod's sandbox status), with
// other lists in between. A swap between the two must not show it the old
// instance exited without the new one: an instance a list showed running,
// and replaced by the swap, reads running (and lists running) until the
// kubelet has read the pod once after the swap.
func TestStatusAfterSwapHoldsTheListedPicture(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	old := k.start(sb, "main")
	listPod := k.list
	k.exit(old, 1)
	if got := listPod(); len(got) != 1 || got[old] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list during the restart: %v, want only the old instance, running", got)
	}
	// The read of that list begins (sandbox status) before the swap and
	// reaches the old instance after it.
	k.readPod(sb)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	// A list of running containers only (the log manager's, which reads the
	// status of each) shows the held instance as it is.
	running := k.listWith(&runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if _, shown := running[old]; shown {
		t.Fatalf("running-only list after the swap shows the held instance")
	}
	if s := k.status(old); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("status after the swap, in the read begun before it: %v, want running as listed", s.State)
	}
	// The next list may still be served before the kubelet's next read,
	// which may belong to a list from before the swap: still held.
	nw := k.m.pods.Get(sb).Latest["main"]
	if got := listPod(); got[old] != runtimeapi.ContainerState_CONTAINER_RUNNING || got[nw] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list after the swap, before the next read: %v, want old held running and new %s running", got, nw)
	}
	if s := k.readPod(sb, old)[old]; s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("status in the first read begun after the swap: %v, want running", s.State)
	}
	// That read was the last that can belong to a list from before the swap;
	// once it is done (readWindow after it began), the hold ends.
	k.m.mu.Lock()
	k.m.pods.Get(sb).Reads.At.Store(time.Now().Add(-readWindow).UnixNano())
	k.m.mu.Unlock()
	if got := listPod(); got[old] != runtimeapi.ContainerState_CONTAINER_EXITED || got[nw] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list after the read: %v, want old exited and new %s running", got, nw)
	}
	if s := k.readPod(sb, old)[old]; s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 {
		t.Fatalf("status in the next read: %v/%d, want exited 1", s.State, s.ExitCode)
	}

	// Again, with the new instance crashing at once: the swap starts the
	// next restart right away, and the instance the kubelet listed last
	// must still read running.
	k.rt.ExitOnStart("main", 1)
	listPod()
	k.exit(nw, 1)
	k.status(nw)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseTerminating || p.Trigger.ContainerID == nw {
		t.Fatalf("phase %s: the instantly crashed instance should be the next trigger", p.Phase)
	}
	if s := k.status(nw); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("listed instance after an instant re-crash: %v, want running as listed", s.State)
	}
}

// A container the kubelet stops itself, or any exit after the kubelet stopped
// the sandbox, is the kubelet's decision: no rule restarts it (a restart there
// would leave a running container behind a finished KillPod).
func TestKubeletStopsAreNotRestarted(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`,
		podspec.RestartRulesPrefix + "side": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	main, side := k.start(sb, "main"), k.start(sb, "side")
	if _, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: main},
		func(ctx context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
			return k.cri.StopContainer(ctx, r)
		}); err != nil {
		t.Fatal(err)
	}
	if s := k.status(main); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 137 || k.m.pods.Get(sb).Phase != restartrecord.PhaseRunning {
		t.Fatalf("kubelet-stopped container: %v/%d, phase %s; want its real exit and no restart", s.State, s.ExitCode, k.m.pods.Get(sb).Phase)
	}
	if _, err := k.m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			return &runtimeapi.StopPodSandboxResponse{}, nil
		}); err != nil {
		t.Fatal(err)
	}
	k.exit(side, 1)
	if s := k.status(side); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || k.m.pods.Get(sb).Phase != restartrecord.PhaseRunning {
		t.Fatalf("exit after StopPodSandbox: %v, phase %s; want its real exit and no restart", s.State, k.m.pods.Get(sb).Phase)
	}
	if created := k.created(); len(created) != 2 {
		t.Fatalf("created %v: nothing may be restarted", created)
	}
}

// Restarts on command (the pod management channel): a pod without rules,
// tracked because TrackAlso says so, restarts one container and then the
// whole pod through the same machinery as the rules.
func TestRestartOnCommand(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	k.rt.ExitOnStart("init", 0)
	ctx := context.Background()
	// Untracked: refused.
	orchestrated := map[string]string{podspec.PodManagementPrefix + "orch": `{"port": 7070, "version": "1.0"}`}
	sb := k.runPod(orchestrated)
	if err := k.m.RestartPod(ctx, sb, "x"); err == nil {
		t.Fatal("an untracked pod was restarted")
	}
	k.m.opts.TrackAlso = func(s podspec.Spec) bool { return s.Orchestrator != nil }
	sb = k.runPod(orchestrated)
	for _, n := range []string{"init", "sidecar", "main"} {
		k.start(sb, n)
	}
	p := k.m.pods.Get(sb)
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
	if err := runSteps(k.m, ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.ContainerRestarts["main"] != 1 || p.Restarts != 0 || len(p.Forced) != 0 {
		t.Fatalf("container restarts %v, pod restarts %d, forced %v", p.ContainerRestarts, p.Restarts, p.Forced)
	}
	if err := k.m.RestartPod(ctx, sb, "job restart"); err != nil {
		t.Fatal(err)
	}
	all := k.stopped()
	stopped := all[len(all)-1]
	if s := k.status(stopped); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || p.Scope != "" {
		t.Fatalf("after RestartPod: kubelet sees %v, scope %q; want a pod restart under way", s.State, p.Scope)
	}
	if err := runSteps(k.m, ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.Restarts != 1 || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("pod restarts %d, phase %s", p.Restarts, p.Phase)
	}
}

// A crash-looping container's record stays the size of its live instances:
// instances the kubelet removes are forgotten (they were kept for ever, and
// the record is written at every restart step).
func TestCrashLoopRecordStaysBounded(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	for i := range 30 {
		cur := p.Latest["main"]
		k.exit(cur, 1)
		k.status(cur)
		if i%2 == 1 {
			// Removed while the next restart is pending: the trigger is kept.
			k.remove(cur)
			if !p.Ours(cur) {
				t.Fatalf("restart %d: the trigger of the restart in progress was forgotten", i+1)
			}
		}
		if err := runSteps(k.m, context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		k.remove(cur) // the kubelet's GC removes the previous instance
	}
	if n := len(p.Instances); n > 2 {
		t.Fatalf("after 30 restarts the record holds %d instances: %v", n, p.Instances)
	}
	if p.ContainerRestarts["main"] != 30 || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("restarts %d phase %s", p.ContainerRestarts["main"], p.Phase)
	}
	if n := k.m.pods.Indexed(); n != len(p.Instances) {
		t.Fatalf("%d instances indexed, pod %d", n, len(p.Instances))
	}
}
