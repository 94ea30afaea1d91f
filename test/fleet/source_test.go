package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// sourceObject is the one PodCheckpoint with spec.sourceImage that every
// node restores a pod from at once.
const (
	sourceNamespace = "team-0"
	sourceObject    = "shared-image"
)

// sourceRace creates one PodCheckpoint with spec.sourceImage and, on every
// node at the same moment, a pod restored from it (the node's Restores, as
// its RunPodSandbox would call it). The first node whose check's outcome
// the API server takes holds the object; every other node's write must
// conflict once, read the object held elsewhere and drop its outcome.
func (f *fleet) sourceRace(sims []shimNode) string {
	ref := "registry.example/checkpoints/origin@sha256:" + strings.Repeat("ab", 32)
	pc := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: sourceNamespace, Name: sourceObject},
		Spec: cpv1.PodCheckpointSpec{SourceImage: ref}}
	if _, err := f.pcp.Create(f.ctx, pc); err != nil {
		f.b.Fatal(err)
	}
	f.objects++
	pods := make([]*corev1.Pod, f.n)
	parallel(f.n, 16, func(i int) {
		p, err := f.admin.CoreV1().Pods(sourceNamespace).Create(f.ctx, podOf(fmt.Sprintf("restore-%03d", i), f.nodes[i]), metav1.CreateOptions{})
		if err != nil {
			f.b.Error(err)
			return
		}
		pods[i] = p
	})
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := 0
	for i, s := range sims {
		if pods[i] == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
			defer cancel()
			if err := s.restoreFrom(ctx, pods[i], sourceObject); err != nil {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	// Every node's check takes registryAnswer; then each writes once.
	var got *cpv1.PodCheckpoint
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if o, err := f.pcp.Get(f.ctx, sourceNamespace, sourceObject); err == nil && o.Status.NodeName != "" {
			got = o
			break
		}
	}
	time.Sleep(15 * time.Second) // the losers' conflicts and reads
	parallel(f.n, 16, func(i int) {
		if pods[i] != nil {
			_ = f.admin.CoreV1().Pods(sourceNamespace).Delete(f.ctx, pods[i].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	})
	if got == nil {
		return fmt.Sprintf("%d nodes restored from one spec.sourceImage object at once (%d refused); no node holds it after a minute", f.n, refused)
	}
	if o, err := f.pcp.Get(f.ctx, sourceNamespace, sourceObject); err == nil {
		got = o
	}
	last, ready := "", ""
	if got.Status.LastRestore != nil {
		last = got.Status.LastRestore.NodeName
	}
	for _, c := range got.Status.Conditions {
		if c.Type == cpv1.ConditionReady {
			ready = string(c.Status) + " " + c.Reason
		}
	}
	return fmt.Sprintf("%d nodes restored from one spec.sourceImage object at once (%d refused); held by %s, lastRestore on %s, Ready %s",
		f.n, refused, got.Status.NodeName, last, ready)
}

// sourceFigures: which nodes' PodCheckpoint status writes the API server
// took (one: no double claim) and the conflicts of the others.
func sourceFigures(c *counts) string {
	writers, most, withConflict, total := 0, 0, 0, 0
	for _, k := range c.pcpStatus {
		if k > 0 {
			writers++
		}
	}
	for _, k := range c.conflicts {
		most = max(most, k)
		total += k
		if k > 0 {
			withConflict++
		}
	}
	return fmt.Sprintf("spec.sourceImage race: %d node(s) wrote the object's status (the claim); %d nodes had a conflict, %d in all, at most %d on one node; requests: %s",
		writers, withConflict, total, most, verbs(c))
}
