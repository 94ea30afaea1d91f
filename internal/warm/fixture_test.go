package warm

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckptstore"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restore"
)

// fixture is the warm-start service of a test's node (ckpttest.NewNode),
// wired as the server wires it: to the node's checkpoint store, a restore
// service and a capture that writes the checkpoints.
type fixture struct {
	rt       *ckpttest.Runtime
	svc      *Service
	restore  *restore.Service
	ckpts    *ledger
	cap      *capture.Service
	root     string
	dir      string
	stateDir string
	table    *podtable.Table
	log      *slog.Logger

	// What the restore service's configuration calls, set by the tests:
	// the check of staged images (nil: criucheck's; the fake's archives
	// hold no CRIU images, so it takes every checkpoint unless a test
	// makes real ones), the pod events and the namespace allow-list.
	imageCheck func(dir string, spec *specs.Spec) error
	podEvent   func(namespace, pod, uid, eventType, reason, action, note string)
	allow      func(from, to string) bool
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	n := ckpttest.NewNode(t)
	fx := &fixture{rt: n.RT, root: n.Root, dir: n.Dir, stateDir: n.StateDir, table: n.Table, log: n.Log, imageCheck: ckpttest.AcceptImages}
	st, err := ckptstore.New(ckptstore.Config{Root: n.Root, Sandboxes: n.Table}, n.RT, n.Log)
	if err != nil {
		t.Fatal(err)
	}
	fx.ckpts = &ledger{Store: st, uses: map[string]int{}}
	if fx.cap, err = capture.New(capture.Config{Root: n.Root, StateDir: n.StateDir, Timing: ckpttest.CaptureTiming, Captures: ckpttest.NoCaptures{},
		Retain: st.Retain, Admit: st.Admit}, n.RT, n.RT, n.RT, n.Log); err != nil {
		t.Fatal(err)
	}
	fx.restore = restore.New(restore.Config{Root: n.Root, RestoreMarks: n.RT.Marks,
		ImageCheck: func(dir string, spec *specs.Spec) error {
			if fx.imageCheck == nil {
				return criucheck.Check(dir, spec, criucheck.Options{})
			}
			return fx.imageCheck(dir, spec)
		},
		PodEvent: func(namespace, pod, uid, eventType, reason, action, note string) {
			if fx.podEvent != nil {
				fx.podEvent(namespace, pod, uid, eventType, reason, action, note)
			}
		},
		RestoreAcrossNamespaces: func(from, to string) bool { return fx.allow != nil && fx.allow(from, to) },
	}, n.RT, n.RT, n.RT, n.Log)
	if fx.svc, err = New(Config{Root: n.Root, Store: n.Store, Sandboxes: n.Table, ShimBinary: "/usr/bin/cri-shim"}, n.RT, fx.restore, fx.ckpts, n.Log); err != nil {
		t.Fatal(err)
	}
	n.Store.Subscribe(fx.restore.SandboxGone)
	n.Store.Subscribe(fx.svc.SandboxGone)
	return fx
}

// checkpointed is newFixture with pod1's app and sidecar checkpointed into
// fx.dir.
func checkpointed(t *testing.T) *fixture {
	t.Helper()
	return checkpointedWith(t, nil)
}

// checkpointedWith is checkpointed with the fixture set up by before (nil:
// as it is) before the checkpoint is taken.
func checkpointedWith(t *testing.T, before func(*fixture)) *fixture {
	t.Helper()
	fx := newFixture(t)
	if before != nil {
		before(fx)
	}
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	return fx
}

// startWith is the proxy's StartContainer of container id through the warm
// service's hook and then the restore service's, whose next is next.
func (fx *fixture) startWith(id string, next func(context.Context, *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error)) error {
	_, err := fx.svc.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id},
		func(ctx context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
			return fx.restore.StartContainer(ctx, r, next)
		})
	return err
}

// start is startWith the runtime's start.
func (fx *fixture) start(id string) error {
	return fx.startWith(id, func(ctx context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
		return fx.rt.StartContainer(ctx, r)
	})
}

// refusals is the restore service's count of refused restores of kind
// (-1 when its metrics cannot be read).
func (fx *fixture) refusals(kind string) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(fx.restore.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != "cri_shim_checkpoint_restores_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "image" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// ledger is the store as the warm service sees it, counting the uses of
// checkpoint directories it records (the store's own count is its
// package's).
type ledger struct {
	*ckptstore.Store
	mu   sync.Mutex
	uses map[string]int
}

func (l *ledger) Use(dir string) func() {
	release := l.Store.Use(dir)
	l.mu.Lock()
	l.uses[dir]++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			if l.uses[dir]--; l.uses[dir] <= 0 {
				delete(l.uses, dir)
			}
			l.mu.Unlock()
			release()
		})
	}
}

// inUse are the directories in use, and their uses.
func (l *ledger) inUse() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.uses)
}
