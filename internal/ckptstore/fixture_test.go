package ckptstore

import (
	"log/slog"
	"testing"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/podtable"
)

// fixture is the store of a test's node (ckpttest.NewNode) and the capture
// that writes its checkpoints, wired as the server wires them.
type fixture struct {
	rt       *ckpttest.Runtime
	store    *Store
	cap      *capture.Service
	capCfg   capture.Config // another capture (a restarted shim's) is made from it
	root     string
	dir      string
	stateDir string
	table    *podtable.Table
	log      *slog.Logger
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, nil)
}

// newFixtureWith is newFixture with the store's and the capture's
// configuration and the task service chosen by setup (nil: the defaults,
// and the fake runtime's tasks).
func newFixtureWith(t *testing.T, setup func(rt *ckpttest.Runtime, cfg *Config, ccfg *capture.Config) capture.Tasks) *fixture {
	t.Helper()
	n := ckpttest.NewNode(t)
	cfg := Config{Root: n.Root, Sandboxes: n.Table}
	ccfg := capture.Config{Root: n.Root, StateDir: n.StateDir, Timing: ckpttest.CaptureTiming, Captures: ckpttest.NoCaptures{}}
	var tasks capture.Tasks = n.RT
	if setup != nil {
		tasks = setup(n.RT, &cfg, &ccfg)
	}
	st, err := New(cfg, n.RT, n.Log)
	if err != nil {
		t.Fatal(err)
	}
	ccfg.Retain, ccfg.Admit = st.Retain, st.Admit
	c, err := capture.New(ccfg, n.RT, n.RT, tasks, n.Log)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{rt: n.RT, store: st, cap: c, capCfg: ccfg, root: n.Root, dir: n.Dir, stateDir: n.StateDir, table: n.Table, log: n.Log}
}
