package server

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/store"
)

// notes are what the test's features saw, in order.
type notes struct {
	mu   sync.Mutex
	seen []string
}

func (n *notes) add(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seen = append(n.seen, s)
}

// watcher is a feature that admits pods, forgets sandboxes gone, has a
// metric, runs, and takes RemoveContainer, noting each.
type watcher struct {
	name string
	n    *notes
}

func (w *watcher) Admit(context.Context, *podtable.Pod) (podtable.Admission, error) {
	w.n.add("admit " + w.name)
	return podtable.Admission{}, nil
}

func (w *watcher) SandboxGone(string) { w.n.add("gone " + w.name) }

func (w *watcher) Collectors() []prometheus.Collector {
	return []prometheus.Collector{prometheus.NewCounter(prometheus.CounterOpts{Name: "test_" + w.name + "_total", Help: "A test feature's metric."})}
}

func (w *watcher) Run(context.Context) { w.n.add("run " + w.name) }

func (w *watcher) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
	next proxy.UnaryNext[runtimeapi.RemoveContainerRequest, runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	return next(ctx, req)
}

// Each entry of the list takes part in what its value implements: a new
// pod is admitted and a sandbox gone is told in the list's order, a CRI
// call crosses the entries from the last to the first, and each entry runs
// after what it uses. An entry whose value is nil takes part in nothing,
// and what uses it waits for nothing.
func TestFeaturesAreWiredInListOrder(t *testing.T) {
	n := &notes{}
	a, b, c := &watcher{"a", n}, &watcher{"b", n}, &watcher{"c", n}
	var absent *watcher
	log := slog.New(slog.DiscardHandler)
	st, err := store.Open(store.RootIn(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	table := podtable.New(nil, st, log)
	reg := prometheus.NewRegistry()
	var g runGroup
	calls := wire(table, st, events.NewFeed(nil, log), reg, &g, []feature{
		{name: "a", value: a},
		{name: "absent", value: absent, uses: []string{"a"}},
		{name: "b", value: b, uses: []string{"absent", "c"}},
		{name: "c", value: c},
		{name: "d", run: func(context.Context) { n.add("run d") }},
		{name: "plain", value: n}, // implements none of it
	})
	if !slices.Equal(calls, []any{c, b, a}) {
		t.Fatalf("calls cross %v, want c, b, a", calls)
	}
	if _, err := table.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{},
		func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
			return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sb"}, nil
		}); err != nil {
		t.Fatal(err)
	}
	if err := st.Gone("sb"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"admit a", "admit b", "admit c", "gone a", "gone b", "gone c"}; !slices.Equal(n.seen, want) {
		t.Fatalf("seen %v, want %v", n.seen, want)
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 3 {
		t.Fatalf("%d metrics registered (%v), want 3", len(mfs), err)
	}
	var names []string
	for _, r := range g.runs {
		names = append(names, r.name)
	}
	if !slices.Equal(names, []string{"a", "absent", "b", "c", "d", "plain"}) {
		t.Fatalf("runnables %v", names)
	}
	n.seen = nil
	stop, err := g.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stop()
	slices.Sort(n.seen)
	if want := []string{"run a", "run b", "run c", "run d"}; !slices.Equal(n.seen, want) {
		t.Fatalf("ran %v, want %v", n.seen, want)
	}
}
