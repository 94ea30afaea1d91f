// Package podtable is the one participant in a pod sandbox's life that the
// proxy sees: it takes RunPodSandbox, StopPodSandbox and RemovePodSandbox for
// every feature, keeps the node's sandboxes (from those calls and from one
// relist of the runtime), and announces a sandbox gone exactly where the
// runtime no longer has it: RemovePodSandbox answered, or the relist not
// listing it. Features learn of it through the state store's lifecycle
// (store.Subscribe), which removes their records right after, and read the
// node's sandboxes with List instead of asking the runtime each.
// docs/architecture.md, "The pod table".
package podtable

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/store"
)

// Runtime is what the table calls on the runtime: the relist, and the
// removal of a sandbox whose admission failed.
type Runtime interface {
	ListPodSandbox(ctx context.Context, in *runtimeapi.ListPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error)
	Remover
}

// Sandbox is what the table keeps of one pod sandbox. The maps and the
// metadata are shared with the table: read them, never change them.
type Sandbox struct {
	ID          string
	Metadata    *runtimeapi.PodSandboxMetadata
	Annotations map[string]string
	Labels      map[string]string
	Handler     string
	Ready       bool
	CreatedAt   int64 // nanoseconds since the epoch
}

// Relist is how often the table asks the runtime for its sandboxes, to see
// those created, stopped or removed behind the shim's back (or while it was
// down).
const Relist = 10 * time.Second

// relistTimeout bounds one relist.
const relistTimeout = 10 * time.Second

// Table is the node's pod sandboxes.
type Table struct {
	rt    Runtime
	adm   Admissions
	st    *store.Store
	log   *slog.Logger
	every time.Duration

	mu   sync.RWMutex
	pods map[string]*Sandbox
	// goneDuring holds the sandboxes announced gone while a relist's list
	// is under way (nil between relists): its answer may still name them.
	goneDuring map[string]bool
}

// New is a table that relists rt every Relist and announces gone sandboxes
// on st's lifecycle.
func New(rt Runtime, st *store.Store, log *slog.Logger) *Table {
	return &Table{rt: rt, adm: Admissions{RT: rt, Log: log}, st: st, log: log, every: Relist,
		pods: map[string]*Sandbox{}}
}

// Register adds features that admit every pod, in the order they admit and
// commit it (RunPodSandbox). Call before serving.
func (t *Table) Register(fs ...Admitter) { t.adm.Features = append(t.adm.Features, fs...) }

// List returns the sandboxes that match keep (all for nil), in no order.
func (t *Table) List(keep func(*Sandbox) bool) []Sandbox {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]Sandbox, 0, len(t.pods))
	for _, p := range t.pods {
		if keep == nil || keep(p) {
			out = append(out, *p)
		}
	}
	return out
}

// Gone forgets sandbox id and announces it gone on the store's lifecycle:
// every feature drops it, then its records are removed (store.Gone).
func (t *Table) Gone(id string) error {
	t.mu.Lock()
	delete(t.pods, id)
	if t.goneDuring != nil {
		t.goneDuring[id] = true
	}
	t.mu.Unlock()
	return t.st.Gone(id)
}

// Sync relists the runtime's sandboxes once, announcing gone those it no
// longer has. The server calls it before the first CRI call is answered, so
// that every feature starts from the sandboxes that exist; List may miss
// sandboxes before. Relists never overlap: Sync runs before Run.
func (t *Table) Sync(ctx context.Context) error { return t.relist(ctx) }

// Run relists the runtime's sandboxes every Relist until ctx ends.
func (t *Table) Run(ctx context.Context) {
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := t.relist(ctx); err != nil && ctx.Err() == nil {
			t.log.Warn("pod table: listing the runtime's sandboxes failed; trying again", "err", err, "in", t.every)
		}
	}
}

// relist takes the runtime's sandboxes into the table and announces gone
// every sandbox that the table or a record knew before the list was asked
// for and that the runtime does not list: one created meanwhile may be
// missing from the answer. A runtime that does not answer changes nothing.
func (t *Table) relist(ctx context.Context) error {
	known, err := t.st.Known()
	if err != nil {
		return err
	}
	t.mu.Lock()
	for id := range t.pods {
		known[id] = true
	}
	t.goneDuring = map[string]bool{}
	t.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, relistTimeout)
	defer cancel()
	resp, err := t.rt.ListPodSandbox(lctx, &runtimeapi.ListPodSandboxRequest{})
	t.mu.Lock()
	gone := t.goneDuring
	t.goneDuring = nil
	if err == nil {
		for _, it := range resp.GetItems() {
			delete(known, it.GetId())
			if !gone[it.GetId()] { // removed through the shim since
				t.pods[it.GetId()] = fromList(it)
			}
		}
	}
	t.mu.Unlock()
	if err != nil {
		return err
	}
	n := 0
	for id := range known {
		if err := t.Gone(id); err != nil {
			t.log.Warn("pod table: removing the records of a sandbox the runtime no longer has", "sandbox", id, "err", err)
			continue
		}
		n++
	}
	if n > 0 {
		t.log.Info("pod table: sandboxes the runtime no longer has are gone", "sandboxes", n)
	}
	return nil
}

func fromList(it *runtimeapi.PodSandbox) *Sandbox {
	return &Sandbox{ID: it.GetId(), Metadata: it.GetMetadata(), Annotations: it.GetAnnotations(), Labels: it.GetLabels(),
		Handler: it.GetRuntimeHandler(), Ready: it.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: it.GetCreatedAt()}
}

// added records a sandbox the runtime just created for cfg.
func (t *Table) added(id, handler string, cfg *runtimeapi.PodSandboxConfig, at time.Time) {
	p := &Sandbox{ID: id, Metadata: cfg.GetMetadata(), Annotations: maps.Clone(cfg.GetAnnotations()), Labels: maps.Clone(cfg.GetLabels()),
		Handler: handler, Ready: true, CreatedAt: at.UnixNano()}
	t.mu.Lock()
	t.pods[id] = p
	t.mu.Unlock()
}

// stopped marks a sandbox not ready.
func (t *Table) stopped(id string) {
	t.mu.Lock()
	if p := t.pods[id]; p != nil && p.Ready {
		c := *p
		c.Ready = false
		t.pods[id] = &c
	}
	t.mu.Unlock()
}
