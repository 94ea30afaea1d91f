package capture

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/capture/capturetest"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// fixture is a service over a task service of pause flags (no CRI: what
// these tests run, resuming recorded pods and emptying incomplete
// checkpoints, asks the runtime nothing else), a checkpoint root with an
// empty directory dir, and containers c1 and c2 running.
type fixture struct {
	svc       *Service
	tasks     *capturetest.Tasks
	root, dir string
	capturing atomic.Pointer[func(id string) bool]
}

// tasks is capturetest.Tasks as the service's Tasks; nothing here captures.
type tasks struct{ *capturetest.Tasks }

func (tasks) Checkpoint(context.Context, string, string, string) error { return errNoCapture }
func (tasks) RWDiff(context.Context, string, io.Writer) error          { return errNoCapture }
func (tasks) Info(context.Context, string) (ContainerInfo, error) {
	return ContainerInfo{}, errNoCapture
}

var errNoCapture = os.ErrInvalid

func newFixture(t *testing.T) *fixture {
	t.Helper()
	base := t.TempDir()
	fx := &fixture{tasks: capturetest.NewTasks(), root: filepath.Join(base, "checkpoints")}
	fx.dir = filepath.Join(fx.root, "cp1")
	if err := os.MkdirAll(fx.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	timing := DefaultTiming
	timing.RetryEvery = 10 * time.Millisecond
	svc, err := New(Config{Root: fx.root, StateDir: filepath.Join(base, "state"), Timing: timing,
		CaptureRunning: func(id string) bool {
			f := fx.capturing.Load()
			return f != nil && (*f)(id)
		}}, nil, nil, tasks{fx.tasks}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fx.svc = svc
	return fx
}

func (fx *fixture) setCapturing(f func(id string) bool) { fx.capturing.Store(&f) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// assertClean fails unless nothing is paused, dir is empty and no record
// is left.
func assertClean(t *testing.T, fx *fixture, when string) {
	t.Helper()
	if p := fx.tasks.AnyPaused(); len(p) > 0 {
		t.Fatalf("%s: %v left paused", when, p)
	}
	if got := entries(t, fx.dir); len(got) != 0 {
		t.Fatalf("%s: %v left in the output", when, got)
	}
	if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 0 {
		t.Fatalf("%s: state left behind: %v", when, got)
	}
}

// A shim restarted while containerd still captures a container it had paused
// waits for that capture to end before resuming (the capture would freeze the
// container again when it ends).
func TestRestartWaitsForRunningCapture(t *testing.T) {
	fx := newFixture(t)
	fx.tasks.SetPaused("c1", true)
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: []string{"c1"}, Started: 1}); err != nil {
		t.Fatal(err)
	}
	capturing := true
	fx.setCapturing(func(id string) bool { return capturing && id == "c1" })
	fx.svc.ResumeRecorded(context.Background())
	if !fx.tasks.IsPaused("c1") {
		t.Fatal("resumed while containerd still captured the container")
	}
	capturing = false
	fx.svc.ResumeRecorded(context.Background())
	assertClean(t, fx, "after the capture ended")
}

func TestIsRuncCheckpoint(t *testing.T) {
	argv := func(a ...string) [][]byte {
		var out [][]byte
		for _, s := range a {
			out = append(out, []byte(s))
		}
		return out
	}
	for _, c := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/usr/sbin/runc", "--root", "/run/containerd/runc/k8s.io", "--log", "l", "checkpoint", "--image-path", "/x", "--work-path", "/y", "abc"}, true},
		{[]string{"runc", "checkpoint", "abc"}, true},
		{[]string{"runc", "checkpoint", "abcd"}, false},
		{[]string{"runc", "pause", "abc"}, false},
		{[]string{"sh", "checkpoint", "abc"}, false},
		{[]string{"runc", "abc"}, false},
	} {
		if got := isRuncCheckpoint(argv(c.argv...), "abc"); got != c.want {
			t.Errorf("%q: %v, want %v", c.argv, got, c.want)
		}
	}
}

// The unfinished checkpoint of a capture containerd still runs is left alone
// at start (CRIU is writing into it) and emptied once the capture ends.
func TestRestartKeepsOutputOfRunningCapture(t *testing.T) {
	fx := newFixture(t)
	fx.tasks.SetPaused("c1", true)
	os.WriteFile(filepath.Join(fx.dir, layout.IncompleteFile), nil, 0o600)
	os.WriteFile(filepath.Join(fx.dir, "pages-1.img"), []byte("being written"), 0o600)
	out, _ := filepath.EvalSymlinks(fx.dir)
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: []string{"c1"}, OutputPath: out, Started: 1}); err != nil {
		t.Fatal(err)
	}
	capturing := make(chan bool, 1)
	capturing <- true
	var asked atomic.Int32 // looks at whether containerd still captures
	fx.setCapturing(func(string) bool {
		v := <-capturing
		capturing <- v
		asked.Add(1)
		return v
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fx.svc.Recover(ctx); fx.svc.RetryResumes(ctx); close(done) }()
	// A second look means the first one's pass is over: it found the
	// capture running and left the record for a later pass.
	untouched := func() {
		if got := entries(t, fx.dir); len(got) != 2 || !fx.tasks.IsPaused("c1") {
			t.Fatalf("touched while containerd captures: output %v, paused %v", got, fx.tasks.IsPaused("c1"))
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for asked.Load() < 2 {
		untouched()
		if time.Now().After(deadline) {
			t.Fatalf("the recovery looked %d times at the running capture in 5 s, want it retrying", asked.Load())
		}
		time.Sleep(time.Millisecond)
	}
	untouched()
	<-capturing
	capturing <- false
	deadline = time.Now().Add(5 * time.Second)
	for len(entries(t, fx.dir)) > 0 || fx.tasks.IsPaused("c1") {
		if time.Now().After(deadline) {
			t.Fatalf("not cleaned after the capture ended: %v", entries(t, fx.dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// A record whose resume is pending does not wipe a complete checkpoint that a
// later call wrote into the same directory (only a directory still marked
// incomplete is emptied), and a record whose sandbox a running call holds is
// left for a later pass instead of being dropped from the retry.
func TestPendingResumeRespectsLaterCalls(t *testing.T) {
	fx := newFixture(t)
	out, _ := filepath.EvalSymlinks(fx.dir)
	fx.tasks.SetPaused("c1", true)
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: []string{"c1"}, OutputPath: out, Started: 1}); err != nil {
		t.Fatal(err)
	}
	// A call of the same sandbox is running: the pass leaves the record.
	j, err := fx.svc.claim(ctxT(t, time.Second), "sb1", filepath.Join(fx.root, "other"), 0)
	if err != nil {
		t.Fatal(err)
	}
	fx.svc.ResumeRecorded(context.Background())
	pending := fx.svc.ResumePending()
	if !fx.tasks.IsPaused("c1") || !pending {
		t.Fatalf("a record of a held sandbox was acted on or dropped from the retry (paused %v, pending %v)", fx.tasks.IsPaused("c1"), pending)
	}
	fx.svc.release(j)
	// Meanwhile a later call left a complete checkpoint in the directory.
	if err := layout.WriteManifest(out, &layout.Manifest{FormatVersion: layout.Version, Containers: []layout.ContainerEntry{{Name: "app", Archive: layout.ArchiveName("app")}}}); err != nil {
		t.Fatal(err)
	}
	fx.svc.ResumeRecorded(context.Background())
	if fx.tasks.IsPaused("c1") {
		t.Fatal("not resumed once the sandbox was free")
	}
	if _, err := os.Stat(filepath.Join(out, layout.ManifestFile)); err != nil {
		t.Fatalf("the later call's complete checkpoint was removed: %v", err)
	}
	if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 0 {
		t.Fatalf("record left: %v", got)
	}
}

// The start-up clean-up of directories marked incomplete leaves alone one that
// a call started meanwhile owns (the socket serves while it runs).
func TestCleanIncompleteSkipsOwnedDirectory(t *testing.T) {
	fx := newFixture(t)
	out, _ := filepath.EvalSymlinks(fx.dir)
	os.WriteFile(filepath.Join(out, layout.IncompleteFile), nil, 0o600)
	os.WriteFile(filepath.Join(out, "pages-1.img"), []byte("being written"), 0o600)
	j, err := fx.svc.claim(ctxT(t, time.Second), "sb1", out, 0)
	if err != nil {
		t.Fatal(err)
	}
	fx.svc.CleanIncomplete(nil)
	if got := entries(t, out); len(got) != 2 {
		t.Fatalf("a directory a call owns was emptied: %v", got)
	}
	fx.svc.release(j)
	fx.svc.CleanIncomplete(nil)
	if got := entries(t, out); len(got) != 0 {
		t.Fatalf("a marked directory nobody owns was not emptied: %v", got)
	}
}
