package capture

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
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
	captures  *fakeCaptures
}

// taskService is capturetest.Tasks as the service's Tasks; nothing here
// captures.
type taskService struct{ *capturetest.Tasks }

func (taskService) Checkpoint(context.Context, string, string, string) error { return errNoCapture }
func (taskService) RWDiff(context.Context, string, io.Writer) error          { return errNoCapture }
func (taskService) Info(context.Context, string) (ContainerInfo, error) {
	return ContainerInfo{}, errNoCapture
}

var errNoCapture = os.ErrInvalid

func newFixture(t *testing.T) *fixture {
	t.Helper()
	base := t.TempDir()
	tasks := capturetest.NewTasks()
	fx := &fixture{tasks: tasks, root: filepath.Join(base, "checkpoints"), captures: newFakeCaptures(tasks)}
	fx.dir = filepath.Join(fx.root, "cp1")
	if err := os.MkdirAll(fx.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	timing := DefaultTiming
	timing.RetryEvery = 10 * time.Millisecond
	svc, err := New(Config{Root: fx.root, StateDir: filepath.Join(base, "state"), Timing: timing, Captures: fx.captures},
		nil, nil, taskService{fx.tasks}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fx.svc = svc
	return fx
}

// recordCapturing leaves what a shim killed mid-capture does: the
// containers ids paused, the frozen record of sandbox sb1 naming them and
// out, and containerd still capturing the first.
func (fx *fixture) recordCapturing(t *testing.T, out string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		fx.tasks.SetPaused(id, true)
	}
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: ids, OutputPath: out, Started: 1}); err != nil {
		t.Fatal(err)
	}
	fx.captures.start(ids[0])
}

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
// resumes it as soon as that capture's process exits, with no further pass:
// not before (the capture, as CRIU does, freezes it again when it ends) and
// without waiting for the retry ticker (none runs here).
func TestRestartResumesWhenCaptureEnds(t *testing.T) {
	fx := newFixture(t)
	fx.recordCapturing(t, "", "c1", "c2")
	fx.svc.ResumeRecorded(context.Background())
	if fx.svc.ResumePending() {
		t.Fatal("a record whose capture runs was left to the retry ticker")
	}
	fx.captures.waitStarted(t)
	if !fx.tasks.IsPaused("c1") || !fx.tasks.IsPaused("c2") {
		t.Fatal("resumed while containerd still captured the pod")
	}
	fx.captures.end("c1")
	fx.svc.Wait()
	assertClean(t, fx, "after the capture ended")
}

// The unfinished checkpoint of a capture containerd still runs is left alone
// at start (CRIU is writing into it), also by the start-up clean-up of
// incomplete directories, and emptied once the capture ends.
func TestRestartKeepsOutputOfRunningCapture(t *testing.T) {
	fx := newFixture(t)
	os.WriteFile(filepath.Join(fx.dir, layout.IncompleteFile), nil, 0o600)
	os.WriteFile(filepath.Join(fx.dir, "pages-1.img"), []byte("being written"), 0o600)
	out, _ := filepath.EvalSymlinks(fx.dir)
	fx.recordCapturing(t, out, "c1")
	fx.svc.Recover(context.Background())
	fx.captures.waitStarted(t)
	if got := entries(t, fx.dir); len(got) != 2 || !fx.tasks.IsPaused("c1") {
		t.Fatalf("touched while containerd captures: output %v, paused %v", got, fx.tasks.IsPaused("c1"))
	}
	// A pass meanwhile (another record's retry) leaves it to the watcher.
	fx.svc.ResumeRecorded(context.Background())
	fx.svc.CleanIncomplete(nil)
	if got := entries(t, fx.dir); len(got) != 2 || !fx.tasks.IsPaused("c1") {
		t.Fatalf("touched by a later pass while containerd captures: output %v, paused %v", got, fx.tasks.IsPaused("c1"))
	}
	fx.captures.end("c1")
	fx.svc.Wait()
	assertClean(t, fx, "after the capture ended")
}

// A resume that fails once the capture has ended (containerd restarting) is
// retried on the ticker until it works.
func TestResumeAfterCaptureFailsIsRetried(t *testing.T) {
	fx := newFixture(t)
	fx.recordCapturing(t, "", "c1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fx.svc.Recover(ctx); fx.svc.RetryResumes(ctx); close(done) }()
	fx.captures.waitStarted(t)
	fx.tasks.FailResumes(3)
	fx.captures.end("c1")
	deadline := time.Now().Add(5 * time.Second)
	for fx.tasks.IsPaused("c1") || len(entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint"))) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a resume that failed after the capture ended was not retried")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	fx.svc.Wait()
	assertClean(t, fx, "after the retried resume")
}

// A watcher ends with its context (the shim stopping): the record stays for
// the next start, the pod as containerd left it.
func TestWatcherStopsWithContext(t *testing.T) {
	fx := newFixture(t)
	fx.recordCapturing(t, "", "c1")
	ctx, cancel := context.WithCancel(context.Background())
	fx.svc.ResumeRecorded(ctx)
	fx.captures.waitStarted(t)
	cancel()
	fx.svc.Wait()
	if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 1 {
		t.Fatalf("records after the watcher stopped: %v, want the one left for the next start", got)
	}
	if j := fx.svc.tryHold("sb1", ""); j == nil {
		t.Fatal("the stopped watcher still holds the sandbox")
	}
}

// A resume of a container that is not paused (any more) or gone needs
// nothing; one containerd refuses while the container is still paused is an
// error.
func TestThaw(t *testing.T) {
	fx := newFixture(t)
	fx.tasks.SetPaused("c1", true)
	if err := fx.svc.thawAll(context.Background(), []string{"c1", "c2"}); err != nil {
		t.Fatalf("resuming a paused and a running container: %v", err)
	}
	if fx.tasks.IsPaused("c1") {
		t.Fatal("c1 still paused")
	}
	fx.tasks.SetPaused("c1", true)
	fx.tasks.FailResumes(1)
	if err := fx.svc.thaw(context.Background(), "c1"); err == nil || !fx.tasks.IsPaused("c1") {
		t.Fatalf("a refused resume of a paused container: %v, paused %v", err, fx.tasks.IsPaused("c1"))
	}
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
