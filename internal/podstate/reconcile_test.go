package podstate

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestReconcileDropsGoneSandboxes(t *testing.T) {
	dir := t.TempDir()
	k, sb, _ := setup(t, dir)
	k.m.reconcile(context.Background())
	if k.m.Tracked() != 1 {
		t.Fatal("a live sandbox was dropped")
	}
	k.rt.sandboxGone = true
	k.m.reconcile(context.Background())
	if k.m.Tracked() != 0 || k.m.pods[sb] != nil {
		t.Fatal("state of a removed sandbox kept")
	}
	if pods, _ := ReadPods(dir); len(pods) != 0 {
		t.Fatalf("state files left: %v", pods)
	}
}

// A crash-looping container's record stays the size of its live instances:
// instances the kubelet removes are forgotten (they were kept for ever, and
// the record is written at every restart step).
func TestCrashLoopRecordStaysBounded(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	for i := range 30 {
		cur := p.Latest["main"]
		k.rt.exit(cur, 1)
		k.status(cur)
		if i%2 == 1 {
			// Removed while the next restart is pending: the trigger is kept.
			k.remove(cur)
			if _, ok := p.IDs[cur]; !ok {
				t.Fatalf("restart %d: the trigger of the restart in progress was forgotten", i+1)
			}
		}
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		k.remove(cur) // the kubelet's GC removes the previous instance
	}
	if n := len(p.IDs) + len(p.Dead) + len(p.Settled) + len(p.Old); n > 6 {
		t.Fatalf("after 30 restarts the record holds %d ids, %d dead, %d settled, %d old", len(p.IDs), len(p.Dead), len(p.Settled), len(p.Old))
	}
	if p.ContainerRestarts["main"] != 30 || p.Phase != PhaseRunning {
		t.Fatalf("restarts %d phase %s", p.ContainerRestarts["main"], p.Phase)
	}
	if len(k.m.byID) != len(p.IDs) {
		t.Fatalf("byID %d entries, pod %d", len(k.m.byID), len(p.IDs))
	}
}

// Instances removed behind the shim's back are pruned by reconcile even while
// the pod is restarting (a crash-looping pod is hardly ever Running).
func TestReconcilePrunesDuringRestart(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	rt := k.rt
	var gone []string
	for range 5 {
		cur := p.Latest["main"]
		k.rt.exit(cur, 1)
		k.status(cur)
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, cur)
	}
	trigger := p.Latest["main"]
	k.rt.exit(trigger, 1)
	k.status(trigger)
	if p.Phase == PhaseRunning {
		t.Fatal("test setup: the pod should be restarting")
	}
	for _, id := range append(gone, trigger) {
		_, _ = rt.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id})
	}
	k.m.reconcile(context.Background())
	for _, id := range gone {
		if _, ok := p.IDs[id]; ok {
			t.Fatalf("removed instance %s still recorded", id)
		}
	}
	if _, ok := p.IDs[trigger]; !ok {
		t.Fatal("the trigger of the restart in progress was pruned")
	}
}
