package criu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// The deadline expires while containerd is still capturing: the call returns
// DeadlineExceeded with every container resumed and the output empty; when the
// capture ends later (re-freezing the container and writing its archive, as a
// real late capture would), the service resumes and cleans up again.
func TestCheckpointPodDeadlineMidCapture(t *testing.T) {
	// The margin the service keeps to resume before the deadline: wide
	// enough that resuming two containers fits in it on a loaded machine
	// under -race (the fixture's 20 ms did not).
	fx := withMarginBase(t, 300*time.Millisecond)
	fx.rt.holdDump = make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := fx.svc.CheckpointPod(ctx, cpReq(fx.dir, "c1", "c2"))
	if status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if dl, _ := ctx.Deadline(); time.Now().After(dl) {
		t.Errorf("answered after the caller's deadline: the caller may see the pod still paused")
	}
	fx.rt.mu.Lock()
	captures := len(fx.rt.dumpSeen)
	fx.rt.mu.Unlock()
	pauses := fx.rt.tasks.Pauses()
	if pauses != 2 || captures != 2 {
		t.Fatalf("test setup: the deadline did not fall mid-capture (%d pauses, %d captures)", pauses, captures)
	}
	if p := fx.rt.tasks.AnyPaused(); len(p) > 0 {
		t.Fatalf("returned with %v paused", p)
	}
	if got := entries(t, fx.dir); len(got) != 0 {
		t.Fatalf("returned with %v in the output", got)
	}
	close(fx.rt.holdDump)
	fx.svc.capture.Wait()
	assertClean(t, fx, "after the late capture ended")
}

// A deadline too close to pause and resume in time: refused, nothing paused.
func TestCheckpointPodDeadlineTooShort(t *testing.T) {
	fx := withMarginBase(t, time.Second)
	_, err := fx.svc.CheckpointPod(ctxT(t, 1500*time.Millisecond), cpReq(fx.dir, "c1", "c2"))
	if status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("got %v", err)
	}
	if fx.rt.tasks.Pauses() != 0 {
		t.Fatal("paused although the deadline left no time")
	}
	assertClean(t, fx, "after a refused short deadline")
}

// containerd refuses the resume (restarting): the call fails, the record
// stays, and Run resumes the containers once containerd answers again.
func TestResumeFailureIsRetried(t *testing.T) {
	fx := newFixture(t)
	fx.rt.tasks.FailResumes(2)
	_, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(fx.dir, "c1", "c2"))
	if err == nil {
		t.Fatal("succeeded although the resume failed")
	}
	if len(fx.rt.tasks.AnyPaused()) == 0 {
		t.Fatal("test setup: expected a container still paused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go fx.svc.Run(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for len(fx.rt.tasks.AnyPaused()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still paused: %v", fx.rt.tasks.AnyPaused())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for time.Now().Before(deadline) && len(entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint"))) > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if got := entries(t, fx.dir); len(got) != 0 {
		t.Fatalf("left %v", got)
	}
}

// A shim killed between pause and resume: the next one resumes the pod and
// removes the unfinished checkpoint at start.
func TestRestartAfterCrashResumesAndCleans(t *testing.T) {
	fx := newFixture(t)
	fx.rt.tasks.SetPaused("c1", true)
	fx.rt.tasks.SetPaused("c2", true)
	os.Mkdir(filepath.Join(fx.dir, layout.ContainersDir), 0o700)
	os.WriteFile(filepath.Join(fx.dir, layout.ContainersDir, "app.tar"), []byte("half"), 0o600)
	os.WriteFile(filepath.Join(fx.dir, layout.IncompleteFile), nil, 0o600)
	leaveFrozenRecord(t, fx, `{"sandboxId":"sb1","containers":["c1","c2"],"outputPath":"`+fx.dir+`","started":1}`)
	// A complete checkpoint next to it must survive.
	other := filepath.Join(fx.root, "complete")
	os.Mkdir(other, 0o700)
	if err := layout.WriteManifest(other, &layout.Manifest{FormatVersion: layout.Version, Containers: []layout.ContainerEntry{{Name: "a", Archive: layout.ArchiveName("a")}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc2, err := New(fx.svc.cfg, fx.rt, fx.rt, fx.rt, fx.svc.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.imageCheck = acceptImages
	done := make(chan struct{})
	go func() { svc2.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(fx.rt.tasks.AnyPaused()) > 0 || len(entries(t, fx.dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("paused %v, output %v", fx.rt.tasks.AnyPaused(), entries(t, fx.dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if _, err := layout.ReadManifest(other); err != nil {
		t.Fatalf("a complete checkpoint was touched: %v", err)
	}
	if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 0 {
		t.Errorf("state left behind: %v", got)
	}
}

func TestConcurrentCheckpointOfOnePodRefused(t *testing.T) {
	fx := newFixture(t)
	fx.rt.holdDump = make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(fx.dir, "c1"))
		errc <- err
	}()
	for fx.rt.tasks.IsPaused("c1") == false {
		time.Sleep(time.Millisecond)
	}
	dir2 := filepath.Join(fx.root, "cp2")
	os.Mkdir(dir2, 0o700)
	_, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(dir2, "c2"))
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition {
		t.Fatalf("second checkpoint of the pod: %v", err)
	}
	close(fx.rt.holdDump)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// withMarginBase is newFixture whose captures keep margin before the
// caller's deadline (and 5 ms per container) to resume.
func withMarginBase(t *testing.T, margin time.Duration) *fixture {
	return newFixtureWith(t, func(rt *fakeRT, cfg *Config) capture.Tasks {
		cfg.CaptureTiming.MarginBase = margin
		return rt
	})
}
