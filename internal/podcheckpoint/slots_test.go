package podcheckpoint

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

func TestSlotsBounds(t *testing.T) {
	s := newSlots(3, 2)
	if !s.take("a") || !s.take("a") {
		t.Fatal("a's first two slots refused")
	}
	if s.take("a") {
		t.Fatal("a third slot for namespace a, over its share of 2")
	}
	if !s.take("b") {
		t.Fatal("b's slot refused while one is free")
	}
	if s.take("c") {
		t.Fatal("a fourth slot, over the bound of 3")
	}
	s.give("a")
	if !s.take("b") {
		t.Fatal("b's second slot refused after a gave one back")
	}
	s.give("a")
	s.give("b")
	s.give("b")
	if s.running != 0 || len(s.byNS) != 0 {
		t.Fatalf("after every slot was given back: %d running, %v", s.running, s.byNS)
	}
}

// heldExporter blocks every push until released, counting those in flight.
type heldExporter struct {
	mu            sync.Mutex
	inFlight, top int
	release       chan struct{}
}

func (h *heldExporter) Export(ctx context.Context, ns, pod, uid, secret, image, dir string) (string, string, error) {
	h.mu.Lock()
	h.inFlight++
	h.top = max(h.top, h.inFlight)
	h.mu.Unlock()
	<-h.release
	h.mu.Lock()
	h.inFlight--
	h.mu.Unlock()
	return image + "@sha256:abc", "sha256:abc", nil
}

// A namespace's objects push at most maxNSExports at once (one goroutine
// each, no more); the others wait their turn and are pushed after.
func TestExportsAreBounded(t *testing.T) {
	old := slotWait
	slotWait = 20 * time.Millisecond
	t.Cleanup(func() { slotWait = old })
	e := newEnv(t)
	h := &heldExporter{release: make(chan struct{})}
	e.r.exporter = h
	e.run(t)
	e.pod("ns", "web", "uid-1")
	const n = 5
	for i := range n {
		pc := object("ns", fmt.Sprintf("cp%d", i), "web")
		pc.Spec.Export = &cpv1.PodCheckpointExport{Image: fmt.Sprintf("reg.example/cp/web:v%d", i)}
		e.create(pc)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.mu.Lock()
		top := h.top
		h.mu.Unlock()
		if top >= maxNSExports {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pushes started, want %d", top, maxNSExports)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // more would start now if they could
	close(h.release)
	for i := range n {
		e.waitExported(t, "ns", fmt.Sprintf("cp%d", i), cpv1.ReasonExported)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.top != maxNSExports {
		t.Fatalf("%d pushes at once, want at most %d", h.top, maxNSExports)
	}
}
