package podtable

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/store"
)

const sb = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// lister answers ListPodSandbox with items, or err; during, when set, runs
// while the call is under way (a sandbox created meanwhile).
type lister struct {
	mu               sync.Mutex
	items            []*runtimeapi.PodSandbox
	err              error
	during           func()
	stopped, removed []string
}

func (l *lister) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest, ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.during != nil {
		l.during()
	}
	if l.err != nil {
		return nil, l.err
	}
	return &runtimeapi.ListPodSandboxResponse{Items: l.items}, nil
}

// StopPodSandbox and RemovePodSandbox record what a rollback removed.
func (l *lister) StopPodSandbox(_ context.Context, in *runtimeapi.StopPodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.StopPodSandboxResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = append(l.stopped, in.GetPodSandboxId())
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (l *lister) RemovePodSandbox(_ context.Context, in *runtimeapi.RemovePodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.removed = append(l.removed, in.GetPodSandboxId())
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// table is a table over a new store with one bucket ("podmgmt").
func table(t *testing.T, rt Runtime) (*Table, *store.Bucket) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Bucket("podmgmt")
	if err != nil {
		t.Fatal(err)
	}
	return New(rt, st, slog.New(slog.NewTextHandler(io.Discard, nil))), b
}

func ids(ps []Sandbox) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.ID)
	}
	slices.Sort(out)
	return out
}

// The relist takes the runtime's sandboxes in, and announces gone those the
// table or a record knew that the runtime no longer lists; a sandbox added
// while the list was under way is kept; a runtime that fails changes
// nothing.
func TestRelist(t *testing.T) {
	rt := &lister{items: []*runtimeapi.PodSandbox{
		{Id: "live", State: runtimeapi.PodSandboxState_SANDBOX_READY, Metadata: &runtimeapi.PodSandboxMetadata{Name: "a", Namespace: "ns"},
			Annotations: map[string]string{"k": "v"}},
		{Id: "stopped", State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY},
	}}
	tb, b := table(t, rt)
	var told []string
	tb.st.Subscribe(func(id string) { told = append(told, id) })
	for _, id := range []string{"recorded", "live"} {
		if err := b.Put(id, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	tb.added("removed-behind-our-back", "", &runtimeapi.PodSandboxConfig{}, time.Time{})
	rt.during = func() { tb.added("created-meanwhile", "", &runtimeapi.PodSandboxConfig{}, time.Time{}) }
	if err := tb.relist(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := ids(tb.List(nil)); !slices.Equal(got, []string{"created-meanwhile", "live", "stopped"}) {
		t.Fatalf("table %v", got)
	}
	slices.Sort(told)
	if !slices.Equal(told, []string{"recorded", "removed-behind-our-back"}) {
		t.Fatalf("announced gone %v", told)
	}
	if keys, _ := b.List(); !slices.Equal(keys, []string{"live"}) {
		t.Fatalf("records left %v", keys)
	}
	ready := tb.List(func(p *Sandbox) bool { return p.Ready })
	if len(ready) != 2 || ready[0].Annotations == nil && ready[1].Annotations == nil {
		t.Fatalf("ready %+v", ready)
	}

	// A sandbox removed through the shim while the list is under way is
	// not taken back from the answer that still names it.
	rt.during = func() {
		if err := tb.Gone("live"); err != nil {
			t.Error(err)
		}
	}
	told = nil
	if err := tb.relist(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := ids(tb.List(nil)); !slices.Equal(got, []string{"stopped"}) || !slices.Equal(told, []string{"live", "created-meanwhile"}) && !slices.Equal(told, []string{"created-meanwhile", "live"}) {
		t.Fatalf("after a removal during the list: table %v, told %v", got, told)
	}

	// The runtime down: nothing is announced, the table stays.
	rt.during, rt.err, told = nil, errors.New("unavailable"), nil
	if err := tb.relist(context.Background()); err == nil || len(told) != 0 || len(tb.List(nil)) != 1 {
		t.Fatalf("relist with the runtime down: %v, told %v, %d sandboxes", err, told, len(tb.List(nil)))
	}
}

// The sandbox calls keep the table current between relists.
func TestSandboxCallsKeepTheTable(t *testing.T) {
	tb, _ := table(t, &lister{})
	cfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "u"}, Annotations: map[string]string{"a": "b"}}
	if _, err := tb.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "runc"},
		func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
			return &runtimeapi.RunPodSandboxResponse{PodSandboxId: sb}, nil
		}); err != nil {
		t.Fatal(err)
	}
	cfg.Annotations["a"] = "changed by the caller"
	got := tb.List(nil)
	if len(got) != 1 || got[0].ID != sb || !got[0].Ready || got[0].Handler != "runc" || got[0].Metadata.GetName() != "p" || got[0].Annotations["a"] != "b" {
		t.Fatalf("after RunPodSandbox: %+v", got)
	}
	if _, err := tb.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			return &runtimeapi.StopPodSandboxResponse{}, nil
		}); err != nil {
		t.Fatal(err)
	}
	if got := tb.List(nil); len(got) != 1 || got[0].Ready {
		t.Fatalf("after StopPodSandbox: %+v", got)
	}
	if _, err := tb.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
			return &runtimeapi.RemovePodSandboxResponse{}, nil
		}); err != nil {
		t.Fatal(err)
	}
	if got := tb.List(nil); len(got) != 0 {
		t.Fatalf("after RemovePodSandbox: %+v", got)
	}
	// A failed create adds nothing.
	if _, err := tb.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg},
		func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
			return nil, errors.New("no")
		}); err == nil || len(tb.List(nil)) != 0 {
		t.Fatalf("failed create: %v, %d sandboxes", err, len(tb.List(nil)))
	}
}
