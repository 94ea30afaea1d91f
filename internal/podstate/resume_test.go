package podstate

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// A shim that died between the runtime creating a replayed container and the
// record naming it: the new process's first list shows neither that instance
// nor the trigger as exited (the kubelet would stop the pod), and Resume
// adopts the instance before any call is answered.
func TestResumeAdoptsAnUnrecordedCreateBeforeServing(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	p := k.m.pods.Get(sb)
	if err := k.m.refineShown(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p.Phase, p.Creating = restartrecord.PhaseStartup, "main/1"
	if err := k.m.pods.Save(p); err != nil {
		t.Fatal(err)
	}
	orphan, err := k.cri.CreateContainer(context.Background(), k.createReq(sb, "main", 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.cri.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: orphan.ContainerId}); err != nil {
		t.Fatal(err)
	}

	k2 := k.restarted(dir)
	m2 := k2.m
	got := k2.list()
	if _, shown := got[orphan.ContainerId]; shown {
		t.Fatalf("the unrecorded instance %s is listed before Resume: %v", orphan.ContainerId, got)
	}
	if got[ids["main"]] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the trigger is listed %v during the restart, want RUNNING", got[ids["main"]])
	}
	m2.Resume(context.Background())
	m2.mu.Lock()
	in := m2.pods.Get(sb).Inst(orphan.ContainerId)
	adopted := in != nil && in.Part == restartrecord.PartNew
	n := ""
	if in != nil {
		n = in.Name
	}
	creating := m2.pods.Get(sb).Creating
	m2.mu.Unlock()
	if !adopted || n != "main" || creating != "" {
		t.Fatalf("after Resume: New[%s]=%q (%v), Creating %q; want the instance adopted", orphan.ContainerId, n, adopted, creating)
	}
}

// A swap that replaced an instance the kubelet's last full list showed
// running keeps it shown running in ContainerStatus; a shim restarted in
// between keeps to that picture.
func TestKeepShownSurvivesARestartOfTheShim(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.list() // the kubelet's relist: main shown running
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	k.m.mu.Lock()
	phase, until := k.m.pods.Get(sb).Phase, k.m.pods.Get(sb).Inst(ids["main"]).HeldUntil
	k.m.mu.Unlock()
	if phase != restartrecord.PhaseRunning || until.IsZero() {
		t.Fatalf("after the swap: phase %s, main kept shown until %v; want Running and kept", phase, until)
	}
	k2 := k.restarted(dir)
	if s := k2.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("restarted shim shows the replaced instance %v before the next full list, want RUNNING", s.State)
	}
	if !until.After(time.Now()) {
		t.Fatal("test setup: hold already over")
	}
}

// The previous process's last list showed main running; main exited while no
// shim ran. The new process judges the exit before it serves and may swap the
// restart in before the kubelet's next relist: the kubelet, still reading
// the statuses of that last list, must read main running, as listed.
func TestResumeKeepsThePreviousProcessesListedPicture(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.list() // the kubelet's relist, served by the previous process
	k.exit(ids["main"], 88)

	k2 := k.restarted(dir)
	m2 := k2.m
	m2.Resume(context.Background())
	if err := runSteps(m2, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	m2.mu.Lock()
	phase := m2.pods.Get(sb).Phase
	m2.mu.Unlock()
	if phase != restartrecord.PhaseRunning {
		t.Fatalf("phase %s after the restart, want Running (swapped)", phase)
	}
	if s := k2.readPod(sb, ids["main"])[ids["main"]]; s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the replaced instance reads %v/%d in the read of the earlier list, want running as listed", s.State, s.ExitCode)
	}
	if s := k2.readPod(sb, ids["main"])[ids["main"]]; s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("in the next read the replaced instance reads %v, want exited", s.State)
	}
}
