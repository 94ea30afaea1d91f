package restore

import (
	"log/slog"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
)

// fixture is the restore service of a test's node (ckpttest.NewNode) and a
// capture that writes the checkpoints it restores.
type fixture struct {
	rt       *ckpttest.Runtime
	svc      *Service
	cap      *capture.Service
	root     string
	dir      string
	stateDir string
	log      *slog.Logger
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	n := ckpttest.NewNode(t)
	c, err := capture.New(capture.Config{Root: n.Root, StateDir: n.StateDir, Timing: ckpttest.CaptureTiming, Captures: ckpttest.NoCaptures{}},
		n.RT, n.RT, n.RT, n.Log)
	if err != nil {
		t.Fatal(err)
	}
	// The fake's archives hold no CRIU images (pages-1.img is a line of
	// text): the images check is criucheck's, tested there and on the real
	// stack; these tests take every checkpoint.
	svc := New(Config{Root: n.Root, RestoreMarks: n.RT.Marks, ImageCheck: ckpttest.AcceptImages}, n.RT, n.RT, n.RT, n.Log)
	n.Store.Subscribe(svc.SandboxGone)
	return &fixture{rt: n.RT, svc: svc, cap: c, root: n.Root, dir: n.Dir, stateDir: n.StateDir, log: n.Log}
}

// checkpointed is newFixture with pod1's app and sidecar checkpointed into
// fx.dir.
func checkpointed(t *testing.T) *fixture {
	t.Helper()
	fx := newFixture(t)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	return fx
}
