package podstate

import (
	"context"
	"math/rand"
	"sort"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// plegKubelet acts as the kubelet's generic PLEG and container deletor do
// (pkg/kubelet/pleg/generic.go, Relist; pkg/kubelet/pod_container_deletor.go,
// getContainersToDeleteInPod): one unfiltered list, a read of the pod when
// anything in it changed, and on ContainerDied the removal of every exited
// instance but the newest (by attempt).
type plegKubelet struct {
	kubelet
	sb   string
	seen map[string]runtimeapi.ContainerState
}

// relist returns the instances that were seen to exit.
func (k *plegKubelet) relist() (died []string) {
	cur := k.list()
	changed := len(cur) != len(k.seen)
	for id, st := range cur {
		if old, ok := k.seen[id]; !ok || old != st {
			changed = true
			if st == runtimeapi.ContainerState_CONTAINER_EXITED {
				died = append(died, id)
			}
		}
	}
	k.seen = cur
	if !changed {
		return nil
	}
	ids := make([]string, 0, len(cur))
	for id := range cur {
		ids = append(ids, id)
	}
	read := k.readPod(k.sb, ids...)
	if len(died) == 0 {
		return nil
	}
	var exited []*runtimeapi.ContainerStatus
	for _, s := range read {
		if s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			exited = append(exited, s)
		}
	}
	sort.Slice(exited, func(i, j int) bool { return exited[i].Metadata.Attempt > exited[j].Metadata.Attempt })
	for _, s := range exited[min(1, len(exited)):] {
		k.remove(s.Id)
	}
	return died
}

// In a crash loop the kubelet reads the pod once per restart (the new
// instance appears); each replaced instance must still come out of its hold
// and be seen to exit, so the kubelet removes it. Renewing the hold of every
// earlier instance at each swap kept them all shown running: none was
// removed, and the restarts stalled on the wait for removals
// (docs/backoff.md, "What the wait costs").
func TestCrashLoopLetsTheKubeletRemoveReplacedInstances(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	k.m.opts.KeepDead = 1
	k.m.backlogWait = time.Millisecond // observe the pile, do not wait on it
	pk := &plegKubelet{kubelet: k, sb: sb}
	pk.relist()
	k.rt.ExitOnStart("main", 1)
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur)
	removedBy := 0
	for i := 1; i <= 12; i++ {
		if err := runSteps(k.m, context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		died := pk.relist()
		k.m.mu.Lock()
		n := len(p.Instances)
		k.m.mu.Unlock()
		if i >= 3 {
			if len(died) == 0 {
				t.Errorf("restart %d: no instance seen to exit", i)
			}
			if n > 4 {
				t.Errorf("restart %d: %d instances of main on record, want at most 4 (running, held, kept, one being removed)", i, n)
			}
		}
		removedBy = n
	}
	if removedBy > 4 {
		t.Fatalf("after 12 restarts %d instances remain", removedBy)
	}
}

// Whatever the order of swaps, of the PLEG's list and of its later read of
// that list, and of other callers' lists, the newest instance a list showed
// is read running: the kubelet never sees the restarted container exited
// before it has seen its new instance (the refused status update the holds
// exist for).
func TestHoldKeepsTheNewestListedInstanceRunning(t *testing.T) {
	for seed := int64(0); seed < 12; seed++ { // about 1 s each
		r := rand.New(rand.NewSource(seed))
		k, sb, p := crashingMainPod(t)
		k.m.backlogWait = time.Millisecond
		k.rt.ExitOnStart("main", 1)
		cur := p.Latest["main"]
		k.exit(cur, 1)
		k.status(cur)
		var listed []string
		pending := false
		for step := range 60 {
			switch r.Intn(4) {
			case 0:
				if err := runSteps(k.m, context.Background(), sb); err != nil {
					t.Fatal(err)
				}
			case 1: // the PLEG's list
				if pending {
					continue
				}
				listed = listed[:0]
				for id := range k.list() {
					listed = append(listed, id)
				}
				pending = true
			case 2: // its read of that list
				if !pending {
					continue
				}
				pending = false
				var newest *runtimeapi.ContainerStatus
				for _, s := range k.readPod(sb, listed...) {
					if newest == nil || s.Metadata.Attempt > newest.Metadata.Attempt {
						newest = s
					}
				}
				if newest != nil && newest.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
					t.Fatalf("seed %d step %d: the newest listed instance (attempt %d) read %v", seed, step, newest.Metadata.Attempt, newest.State)
				}
			case 3: // another caller's unfiltered list (container GC)
				k.list()
			}
		}
	}
}
