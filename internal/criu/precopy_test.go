package criu

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recRT is the fake runtime's task service recording, in order, the calls
// the capture makes, and a pre-dumper writing images like CRIU's pre-dump.
// It is not a ParentCheckpointer (containerd's case); parentRT is.
type recRT struct {
	*fakeRT
	mu      sync.Mutex
	calls   []string
	failPre map[string]error
	// pausedAtPreDump lists containers found paused when a pre-dump ran.
	pausedAtPreDump []string
}

func (r *recRT) record(c string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

func (r *recRT) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// phases is recorded with each run of calls of one kind sorted: the
// containers of a pod are paused, and resumed, in parallel.
func (r *recRT) phases() []string {
	calls := r.recorded()
	for i := 0; i < len(calls); {
		verb, _, _ := strings.Cut(calls[i], " ")
		j := i + 1
		for j < len(calls) && strings.HasPrefix(calls[j], verb+" ") {
			j++
		}
		slices.Sort(calls[i:j])
		i = j
	}
	return calls
}

func (r *recRT) Pause(ctx context.Context, id string) error {
	r.record("pause " + id)
	return r.fakeRT.Pause(ctx, id)
}

func (r *recRT) Resume(ctx context.Context, id string) error {
	r.record("resume " + id)
	return r.fakeRT.Resume(ctx, id)
}

func (r *recRT) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	r.record("checkpoint " + id)
	return r.fakeRT.Checkpoint(ctx, id, imageDir, workDir)
}

func (r *recRT) PreDump(_ context.Context, id, dir string) error {
	r.record("pre-dump " + id)
	r.mu.Lock()
	r.pausedAtPreDump = append(r.pausedAtPreDump, r.tasks.anyPaused()...)
	err := r.failPre[id]
	r.mu.Unlock()
	if fi, serr := os.Stat(dir); serr != nil || fi.Mode().Perm() != 0o700 {
		return errors.Join(errors.New("pre-dump directory missing or not 0700"), serr)
	}
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "pages-1.img"), []byte("pre-dump of "+id), 0o600)
}

// parentRT is recRT with a capture that builds on a pre-dump, as CRIU does:
// it reads the parent relative to the image directory and links to it.
type parentRT struct{ *recRT }

func (p parentRT) CheckpointWithParent(ctx context.Context, id, imageDir, workDir, parent string) error {
	p.record("checkpoint " + id + " parent " + parent)
	if filepath.IsAbs(parent) {
		return errors.New("fake: the parent must be relative to the image directory")
	}
	if _, err := os.Stat(filepath.Join(imageDir, parent, "pages-1.img")); err != nil {
		return err
	}
	if err := p.fakeRT.Checkpoint(ctx, id, imageDir, workDir); err != nil {
		return err
	}
	return os.Symlink(parent, filepath.Join(imageDir, "parent"))
}

// preCopyFixture is a fixture whose service has pre-copy configured as pc
// (its pre-dumper the recording runtime), over a task service that can take
// a parent or not, and whose dirty-tracking check answers tracking.
func preCopyFixture(t *testing.T, pc PreCopyConfig, tracking, withParent bool) (*fixture, *recRT, *int) {
	t.Helper()
	var rec *recRT
	asked := new(int)
	fx := newFixtureWith(t, func(rt *fakeRT, cfg *Config) Tasks {
		rec = &recRT{fakeRT: rt, failPre: map[string]error{}}
		cfg.PreCopy = pc
		if cfg.PreCopy.PreDumper == nil && pc.Mode != "" {
			cfg.PreCopy.PreDumper = rec
		}
		cfg.PreCopy.DirtyTracking = func() (bool, error) { *asked++; return tracking, nil }
		if withParent {
			return parentRT{rec}
		}
		return rec
	})
	return fx, rec, asked
}

func checkpointSequential(t *testing.T, fx *fixture) *Manifest {
	t.Helper()
	req := cpReq(fx.dir, "c1", "c2")
	req.Options = map[string]string{OptionSequential: "true"}
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), req); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(fx.dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// assertCompleteAndRunning: the checkpoint of app and sidecar holds their
// archives only (no staging left), nothing is paused, no record is left.
func assertCompleteAndRunning(t *testing.T, fx *fixture) {
	t.Helper()
	if got := entries(t, filepath.Join(fx.dir, containersDir)); !slices.Equal(got, []string{"app.tar", "sidecar.tar"}) {
		t.Errorf("containers/ holds %v (staging left?)", got)
	}
	if p := fx.rt.tasks.anyPaused(); len(p) > 0 {
		t.Errorf("left paused: %v", p)
	}
	if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 0 {
		t.Errorf("state left behind: %v", got)
	}
}

// archiveMembers lists an archive's members, links as "name -> target".
func archiveMembers(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeSymlink {
			out = append(out, h.Name+" -> "+h.Linkname)
			continue
		}
		out = append(out, h.Name)
	}
}

// Without dirty-page tracking (this machine's kernel) a checkpoint makes
// exactly the calls it made before pre-copy existed, in the same order, and
// writes the same archives; the manifest says why pre-copy was not used.
func TestPreCopyWithoutDirtyTrackingIsTodaysPath(t *testing.T) {
	base, baseRec, _ := preCopyFixture(t, PreCopyConfig{}, false, false)
	bm := checkpointSequential(t, base)

	fx, rec, asked := preCopyFixture(t, PreCopyConfig{Mode: PreCopyAuto}, false, true)
	m := checkpointSequential(t, fx)
	if *asked != 1 {
		t.Errorf("dirty tracking asked %d times, want once (at start)", *asked)
	}
	if got, want := rec.phases(), baseRec.phases(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want today's %v", got, want)
	}
	for _, c := range rec.recorded() {
		if strings.HasPrefix(c, "pre-dump") || strings.Contains(c, "parent") {
			t.Errorf("call %q without dirty-page tracking", c)
		}
	}
	if m.PreCopy == nil || m.PreCopy.Used || m.PreCopy.Reason != reasonNoDirtyTracking {
		t.Errorf("manifest preCopy %+v, want not used: %q", m.PreCopy, reasonNoDirtyTracking)
	}
	if bm.PreCopy == nil || bm.PreCopy.Used || bm.PreCopy.Reason != reasonPreCopyOff {
		t.Errorf("pre-copy off: manifest preCopy %+v", bm.PreCopy)
	}
	for _, name := range []string{"app", "sidecar"} {
		got, want := archiveMembers(t, filepath.Join(fx.dir, archiveName(name))), archiveMembers(t, filepath.Join(base.dir, archiveName(name)))
		if !slices.Equal(got, want) {
			t.Errorf("%s archive %v, want %v", name, got, want)
		}
	}
	if v := testutil.ToFloat64(fx.svc.metrics.preCopy); v != 0 {
		t.Errorf("cri_shim_checkpoint_precopy_available %v, want 0", v)
	}
	checkArchive(t, filepath.Join(fx.dir, archiveName("app")), "c1")
}

// With tracking and a runtime that takes a parent: every container is
// pre-dumped while none is paused, then the pod is paused and each final
// dump names its pre-dump as parent; the archive carries the pre-dump and
// CRIU's parent link, and nothing is left paused or staged.
func TestPreCopyPreDumpsBeforeThePause(t *testing.T) {
	for _, sequential := range []bool{false, true} {
		fx, rec, _ := preCopyFixture(t, PreCopyConfig{Mode: PreCopyAuto}, true, true)
		req := cpReq(fx.dir, "c1", "c2")
		if sequential {
			req.Options = map[string]string{OptionSequential: "true"}
		}
		if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), req); err != nil {
			t.Fatalf("sequential=%v: %v", sequential, err)
		}
		calls := rec.recorded()
		firstPause := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "pause") })
		for _, id := range []string{"c1", "c2"} {
			i := slices.Index(calls, "pre-dump "+id)
			if i < 0 || i > firstPause {
				t.Errorf("sequential=%v: pre-dump of %s at %d, first pause at %d: %v", sequential, id, i, firstPause, calls)
			}
			if !slices.Contains(calls, "checkpoint "+id+" parent "+preDumpParent) {
				t.Errorf("sequential=%v: %s's final dump did not name its pre-dump: %v", sequential, id, calls)
			}
			if slices.Contains(calls, "checkpoint "+id) {
				t.Errorf("sequential=%v: %s also dumped without parent: %v", sequential, id, calls)
			}
			if seen := fx.rt.dumpSeen[id]; !seen["c1"] || !seen["c2"] {
				t.Errorf("sequential=%v: final dump of %s not in one cut: %v", sequential, id, seen)
			}
		}
		if len(rec.pausedAtPreDump) > 0 {
			t.Errorf("sequential=%v: paused during a pre-dump: %v", sequential, rec.pausedAtPreDump)
		}
		m, err := ReadManifest(fx.dir)
		if err != nil {
			t.Fatal(err)
		}
		if m.PreCopy == nil || !m.PreCopy.Used || m.PreCopy.Reason != "" || m.PreCopy.PreDumpSeconds <= 0 {
			t.Errorf("manifest preCopy %+v, want used", m.PreCopy)
		}
		members := archiveMembers(t, filepath.Join(fx.dir, archiveName("app")))
		for _, want := range []string{"checkpoint/parent -> ../checkpoint-pre-dump", "checkpoint-pre-dump/", "checkpoint-pre-dump/pages-1.img", "checkpoint/pages-1.img"} {
			if !slices.Contains(members, want) {
				t.Errorf("archive lacks %s: %v", want, members)
			}
		}
		checkArchive(t, filepath.Join(fx.dir, archiveName("app")), "c1")
		assertCompleteAndRunning(t, fx)
		if v := testutil.ToFloat64(fx.svc.metrics.preCopy); v != 1 {
			t.Errorf("cri_shim_checkpoint_precopy_available %v, want 1", v)
		}
	}
}

// A pre-dump that fails falls back to the ordinary capture of every
// container: no parent, no pre-dump in the archives, the reason in the
// manifest, nothing paused or staged.
func TestPreCopyFallsBackOnPreDumpFailure(t *testing.T) {
	fx, rec, _ := preCopyFixture(t, PreCopyConfig{Mode: PreCopyAuto}, true, true)
	rec.failPre["c2"] = errors.New("fake: criu pre-dump failed")
	m := checkpointSequential(t, fx)
	calls := rec.recorded()
	for _, id := range []string{"c1", "c2"} {
		if !slices.Contains(calls, "checkpoint "+id) {
			t.Errorf("%s not captured the ordinary way: %v", id, calls)
		}
	}
	for _, c := range calls {
		if strings.Contains(c, "parent") {
			t.Errorf("final dump %q after a failed pre-dump", c)
		}
	}
	if m.PreCopy == nil || m.PreCopy.Used || !strings.Contains(m.PreCopy.Reason, "fake: criu pre-dump failed") || !strings.Contains(m.PreCopy.Reason, "sidecar") {
		t.Errorf("manifest preCopy %+v, want the failed pre-dump named", m.PreCopy)
	}
	for _, name := range []string{"app", "sidecar"} {
		for _, mem := range archiveMembers(t, filepath.Join(fx.dir, archiveName(name))) {
			if strings.HasPrefix(mem, preDumpDir) || strings.Contains(mem, "parent") {
				t.Errorf("%s archive holds %s after the fallback", name, mem)
			}
		}
	}
	assertCompleteAndRunning(t, fx)
}

// A call whose deadline passes during the pre-dumps pauses nothing and
// leaves nothing behind.
func TestPreCopyDeadlineDuringPreDump(t *testing.T) {
	fx, _, _ := preCopyFixture(t, PreCopyConfig{Mode: PreCopyAuto, PreDumper: slowPreDumper{200 * time.Millisecond}}, true, true)
	_, err := fx.svc.CheckpointPod(ctxT(t, 150*time.Millisecond), cpReq(fx.dir, "c1", "c2"))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nothing was paused") {
		t.Fatalf("err %v, want DeadlineExceeded with nothing paused", err)
	}
	if fx.rt.tasks.pauses != 0 {
		t.Errorf("%d pauses", fx.rt.tasks.pauses)
	}
	assertClean(t, fx, "after a deadline during the pre-dumps")
}

type slowPreDumper struct{ d time.Duration }

func (s slowPreDumper) PreDump(ctx context.Context, _, dir string) error {
	time.Sleep(s.d) // a pre-dump cannot be interrupted
	return os.WriteFile(filepath.Join(dir, "pages-1.img"), nil, 0o600)
}

// The start-up decision: off in the configuration, a runtime that cannot
// pass a parent or no pre-dumper never run the check (no CRIU process at
// start on containerd); a failed check keeps pre-copy off; each with its
// reason.
func TestPlanPreCopy(t *testing.T) {
	rt := &fakeRT{}
	pd := &recRT{}
	asked := 0
	yes := func() (bool, error) { asked++; return true, nil }
	for _, tc := range []struct {
		name    string
		cfg     PreCopyConfig
		tasks   Tasks
		use     bool
		reason  string
		checked bool
	}{
		{"off", PreCopyConfig{Mode: PreCopyOff, DirtyTracking: yes, PreDumper: pd}, parentRT{&recRT{fakeRT: rt}}, false, reasonPreCopyOff, false},
		{"unset", PreCopyConfig{DirtyTracking: yes, PreDumper: pd}, parentRT{&recRT{fakeRT: rt}}, false, reasonPreCopyOff, false},
		{"no check", PreCopyConfig{Mode: PreCopyAuto, PreDumper: pd}, parentRT{&recRT{fakeRT: rt}}, false, reasonNoDirtyTracking, false},
		{"check fails", PreCopyConfig{Mode: PreCopyAuto, DirtyTracking: func() (bool, error) { asked++; return false, errors.New("criu: not found") }, PreDumper: pd},
			parentRT{&recRT{fakeRT: rt}}, false, "the dirty-page tracking check failed: criu: not found", true},
		{"containerd", PreCopyConfig{Mode: PreCopyAuto, DirtyTracking: yes, PreDumper: pd}, rt, false, reasonNoParent, false},
		{"no pre-dumper", PreCopyConfig{Mode: PreCopyAuto, DirtyTracking: yes}, parentRT{&recRT{fakeRT: rt}}, false, reasonNoPreDumper, false},
		{"on", PreCopyConfig{Mode: PreCopyAuto, DirtyTracking: yes, PreDumper: pd}, parentRT{&recRT{fakeRT: rt}}, true, "", true},
	} {
		asked = 0
		p := planPreCopy(tc.cfg, tc.tasks)
		if p.use != tc.use || p.reason != tc.reason {
			t.Errorf("%s: use %v reason %q, want %v %q", tc.name, p.use, p.reason, tc.use, tc.reason)
		}
		if got := asked != 0; got != tc.checked {
			t.Errorf("%s: dirty tracking checked %v, want %v", tc.name, got, tc.checked)
		}
		if !tc.checked && p.tracking != "not checked" {
			t.Errorf("%s: tracking %q, want \"not checked\"", tc.name, p.tracking)
		}
	}
	var _ Tasks = (*ContainerdTasks)(nil)
	if _, ok := any((*ContainerdTasks)(nil)).(ParentCheckpointer); ok {
		t.Error("ContainerdTasks claims to pass a parent to runc's checkpoint; containerd 2.2 does not")
	}
}

// Pre-copy off in the configuration: the check is not run and no pre-dump is made.
func TestPreCopyOffInConfig(t *testing.T) {
	fx, rec, asked := preCopyFixture(t, PreCopyConfig{Mode: PreCopyOff}, true, true)
	m := checkpointSequential(t, fx)
	if *asked != 0 {
		t.Errorf("dirty tracking checked %d times with pre-copy off", *asked)
	}
	for _, c := range rec.recorded() {
		if strings.HasPrefix(c, "pre-dump") || strings.Contains(c, "parent") {
			t.Errorf("call %q with pre-copy off", c)
		}
	}
	if m.PreCopy == nil || m.PreCopy.Used || m.PreCopy.Reason != reasonPreCopyOff {
		t.Errorf("manifest preCopy %+v", m.PreCopy)
	}
}

// CRIU's options for a pre-dump: the directory by descriptor, the tree's
// root, memory tracking on (the final dump reads only dirtied pages), a log.
func TestPreDumpOpts(t *testing.T) {
	o := preDumpOpts(7, 4242)
	if o.GetImagesDirFd() != 7 || o.GetPid() != 4242 || !o.GetTrackMem() || o.GetLogFile() != preDumpLog || o.GetLogLevel() != 4 {
		t.Errorf("pre-dump options %v", o)
	}
	if o.GetLeaveRunning() || o.GetParentImg() != "" {
		t.Errorf("pre-dump options %v: a single pre-dump has no parent and always leaves the tasks running", o)
	}
	if preDumpParent != "../"+crmetadata.CheckpointDirectory+"-pre-dump" {
		t.Errorf("parent %q", preDumpParent)
	}
}

// A manifest without preCopy (earlier builds) reads as before; one with it
// reads back what was written.
func TestManifestPreCopyField(t *testing.T) {
	old := `{"formatVersion":1,"pod":{"name":"p","namespace":"n","uid":"u","sandboxId":"s"},` +
		`"containers":[{"name":"app","id":"c1","archive":"containers/app.tar"}]}`
	m, err := ParseManifest([]byte(old))
	if err != nil || m.PreCopy != nil {
		t.Fatalf("old manifest: %v, preCopy %+v", err, m.PreCopy)
	}
	m.PreCopy = &PreCopyInfo{Reason: reasonNoDirtyTracking}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"preCopy":{"used":false,"reason":"kernel has no dirty-page tracking`) {
		t.Errorf("manifest %s", b)
	}
	back, err := ParseManifest(b)
	if err != nil || back.PreCopy == nil || *back.PreCopy != *m.PreCopy {
		t.Errorf("read back %v %+v", err, back.PreCopy)
	}
}
