package podstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// testCurve is the tests' backoff curve: the real shape (doubling to a
// maximum), short enough that the executor's backoff wait, which runs on the
// wall clock as in the shim, is taken in every test that restarts.
var testCurve = backoff.Curve{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond}

const rules88 = `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]`

func TestStopPodSandboxAbandonsRestart(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	_, err := k.m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			return &runtimeapi.StopPodSandboxResponse{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if s := k.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 88 {
		t.Fatalf("after StopPodSandbox the real exit must show: %+v", s)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil || len(k.created()) != 3 {
		t.Fatalf("abandoned restart still replayed: %v %v", k.created(), err)
	}
}

func TestUntrackedPodsAreNotTouched(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": "not json"})
	if k.m.Tracked() != 0 {
		t.Fatal("a pod whose only rules are malformed is tracked")
	}
	id := k.start(sb, "main")
	k.exit(id, 88)
	if s := k.status(id); s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("untracked pod's exit changed: %v", s.State)
	}
}

// The event stream must not tell the kubelet about a triggering exit or about
// old instances while a restart is in progress.
func TestEventsOfRestartingPodAreDropped(t *testing.T) {
	k, _, ids := setup(t, t.TempDir())
	k.exit(ids["main"], 88)
	st, _ := k.cri.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]})
	ev := &runtimeapi.ContainerEventResponse{ContainerId: ids["main"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{st.Status}}
	if !k.m.DropEvent(ev) {
		t.Fatal("the triggering exit's event was relayed")
	}
	k.exit(ids["sidecar"], 137)
	st, _ = k.cri.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["sidecar"]})
	if !k.m.DropEvent(&runtimeapi.ContainerEventResponse{ContainerId: ids["sidecar"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{st.Status}}) {
		t.Fatal("an old instance's stop event was relayed during the restart")
	}
	if k.m.DropEvent(&runtimeapi.ContainerEventResponse{ContainerId: "unrelated", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}) {
		t.Fatal("an unrelated event was dropped")
	}
}

// An exit delivered by the shim's event feed starts the restart before any
// kubelet call; events of other types or other containers change nothing.
func TestExitSeenThroughEventFeed(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	feed := func(id string, typ runtimeapi.ContainerEventType) { k.event(sb, id, typ) }
	k.exit(ids["main"], 88)
	feed(ids["main"], runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	feed("unrelated", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.mu.Lock()
	ph := k.m.pods.Get(sb).Phase
	k.m.mu.Unlock()
	if ph != restartrecord.PhaseRunning {
		t.Fatalf("phase %s after events that are not this pod's exit", ph)
	}
	feed(ids["main"], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.mu.Lock()
	p := k.m.pods.Get(sb)
	ph, trig := p.Phase, p.Trigger
	k.m.mu.Unlock()
	if ph != restartrecord.PhaseTerminating || trig == nil || trig.ContainerID != ids["main"] || trig.ExitCode != 88 {
		t.Fatalf("after the exit event: phase %s trigger %+v", ph, trig)
	}
}

// Instances removed behind the shim's back are pruned by reconcile even while
// the pod is restarting (a crash-looping pod is hardly ever Running).
func TestReconcilePrunesDuringRestart(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	var gone []string
	for range 5 {
		cur := p.Latest["main"]
		k.exit(cur, 1)
		k.status(cur)
		if err := runSteps(k.m, context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, cur)
	}
	trigger := p.Latest["main"]
	k.exit(trigger, 1)
	k.status(trigger)
	if p.Phase == restartrecord.PhaseRunning {
		t.Fatal("test setup: the pod should be restarting")
	}
	// The oldest exited instance stays in the runtime: reconcile keeps it.
	kept, gone := gone[0], gone[1:]
	for _, id := range append(gone, trigger) {
		_, _ = k.cri.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id})
	}
	k.m.reconcile(context.Background())
	for _, id := range gone {
		if p.Ours(id) {
			t.Fatalf("removed instance %s still recorded", id)
		}
	}
	if !p.Ours(kept) {
		t.Fatalf("instance %s, which the runtime still lists, was pruned", kept)
	}
	if !p.Ours(trigger) {
		t.Fatal("the trigger of the restart in progress was pruned")
	}
}

// A sandbox stopped behind the shim's back: the failed start ends the
// restart for good instead of being retried (and the container is not
// removed: containerd 2.2.1 panics removing one whose sandbox is gone).
func TestRestartAbandonedWhenSandboxDies(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur)
	// A step failing while the sandbox is ready is retried, not abandoned.
	if k.m.abandonIfSandboxGone(context.Background(), sb, fmt.Errorf("transient")) || p.Stopped {
		t.Fatal("abandoned with a ready sandbox")
	}
	// The sandbox dies between the replay's create and its start.
	k.rt.OnCall("StartContainer", func(context.Context, string, any) error {
		k.rt.OnCall("StartContainer", nil)
		return k.rt.SandboxExit(sb)
	})
	err := runSteps(k.m, context.Background(), sb)
	starts := k.rt.Requests("StartContainer")
	failed := starts[len(starts)-1].(*runtimeapi.StartContainerRequest).ContainerId
	if s := k.container(failed); err == nil || s.Reason != "StartError" {
		t.Fatalf("the start in a dead sandbox: %v, instance %v", err, s)
	}
	if !k.m.abandonIfSandboxGone(context.Background(), sb, err) {
		t.Fatal("restart not abandoned although the sandbox is not ready")
	}
	if p.Phase != restartrecord.PhaseRunning || !p.Stopped {
		t.Fatalf("phase %s stopped %v", p.Phase, p.Stopped)
	}
	// A later step does nothing, and nothing was removed: the failed
	// instance is still in the runtime.
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if removed := k.rt.Requests("RemoveContainer"); len(removed) != 0 {
		t.Fatalf("removed %v", removed)
	}
	k.container(failed)
}
