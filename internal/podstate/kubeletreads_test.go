package podstate

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet reads pods as one full ListContainers and then, seconds later
// under load, the status of each listed container, with other lists in
// between. A swap between the two must not show it the old instance exited
// without the new one: an instance the last full list showed running, and
// replaced by the swap, reads running until the next full list.
func TestStatusAfterSwapHoldsTheListedPicture(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	old := k.start(sb, "main")
	// The kubelet's PLEG relist: one unfiltered list, then the statuses.
	listPod := k.list
	k.rt.exit(old, 1)
	if got := listPod(); len(got) != 1 || got[old] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list during the restart: %v, want only the old instance, running", got)
	}
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	// Another caller's list of running containers only (the kubelet's
	// GetPods(false)) does not show the old instance either way.
	if _, err := k.m.listContainers(context.Background(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}},
		func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			return k.rt.ListContainers(ctx, r)
		}); err != nil {
		t.Fatal(err)
	}
	if s := k.status(old); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("status after the swap, before a new list: %v, want running as listed", s.State)
	}
	got := listPod()
	nw := k.m.pods[sb].Latest["main"]
	if got[old] != runtimeapi.ContainerState_CONTAINER_EXITED || got[nw] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list after the swap: %v, want old exited and new %s running", got, nw)
	}
	if s := k.status(old); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 {
		t.Fatalf("status after the next full list: %v/%d, want exited 1", s.State, s.ExitCode)
	}

	// Again, with the new instance crashing at once: the swap starts the
	// next restart right away, and the instance the kubelet listed last
	// must still read running.
	k.rt.exitOnStart["main"] = 1
	listPod()
	k.rt.exit(nw, 1)
	k.status(nw)
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if p := k.m.pods[sb]; p.Phase != PhaseTerminating || p.Trigger.ContainerID == nw {
		t.Fatalf("phase %s: the instantly crashed instance should be the next trigger", p.Phase)
	}
	if s := k.status(nw); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("listed instance after an instant re-crash: %v, want running as listed", s.State)
	}
}

// The PLEG's relist (a full container list right after a full sandbox list)
// is told from the stats provider's (a full container list with no sandbox
// list before it); a kubelet that never lists sandboxes has every full list
// taken as a relist.
func TestRelistToldFromStatsList(t *testing.T) {
	k, _, _ := setup(t, t.TempDir())
	m := k.m
	if !m.isRelist() {
		t.Fatal("no sandbox list ever seen: a full list must count as the relist")
	}
	m.sawSandboxList(2)
	if !m.isRelist() {
		t.Fatal("container list right after the sandbox list: not taken as the relist")
	}
	if m.isRelist() {
		t.Fatal("a second full list (the stats provider's) taken as a relist")
	}
	m.sawSandboxList(40) // a filtered sandbox list
	if m.isRelist() {
		t.Fatal("a filtered sandbox list made the next container list a relist")
	}
	m.sawSandboxList(0)
	m.sandboxListAt.Store(time.Now().Add(-time.Second).UnixNano())
	if m.isRelist() {
		t.Fatal("a container list a second after the sandbox list taken as the relist")
	}
}

// The event stream must not tell the kubelet about a triggering exit or about
// old instances while a restart is in progress.
func TestEventsOfRestartingPodAreDropped(t *testing.T) {
	k, _, ids := setup(t, t.TempDir())
	k.rt.exit(ids["main"], 88)
	st, _ := k.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]})
	ev := &runtimeapi.ContainerEventResponse{ContainerId: ids["main"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{st.Status}}
	if !k.m.dropEvent(ev) {
		t.Fatal("the triggering exit's event was relayed")
	}
	k.rt.exit(ids["sidecar"], 137)
	st, _ = k.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["sidecar"]})
	if !k.m.dropEvent(&runtimeapi.ContainerEventResponse{ContainerId: ids["sidecar"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{st.Status}}) {
		t.Fatal("an old instance's stop event was relayed during the restart")
	}
	if k.m.dropEvent(&runtimeapi.ContainerEventResponse{ContainerId: "unrelated", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}) {
		t.Fatal("an unrelated event was dropped")
	}
}

// An exit delivered by the shim's event feed starts the restart before any
// kubelet call; events of other types or other containers change nothing.
func TestExitSeenThroughEventFeed(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	feed := func(id string, typ runtimeapi.ContainerEventType) { k.event(sb, id, typ) }
	k.rt.exit(ids["main"], 88)
	feed(ids["main"], runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	feed("unrelated", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.mu.Lock()
	ph := k.m.pods[sb].Phase
	k.m.mu.Unlock()
	if ph != PhaseRunning {
		t.Fatalf("phase %s after events that are not this pod's exit", ph)
	}
	feed(ids["main"], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.mu.Lock()
	p := k.m.pods[sb]
	ph, trig := p.Phase, p.Trigger
	k.m.mu.Unlock()
	if ph != PhaseTerminating || trig == nil || trig.ContainerID != ids["main"] || trig.ExitCode != 88 {
		t.Fatalf("after the exit event: phase %s trigger %+v", ph, trig)
	}
}
