package ckptstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
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
	fx.rt.HoldDump = make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := fx.cap.CheckpointPod(ctx, ckpttest.CpReq(fx.dir, "c1", "c2"))
	if status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if dl, _ := ctx.Deadline(); time.Now().After(dl) {
		t.Errorf("answered after the caller's deadline: the caller may see the pod still paused")
	}
	fx.rt.Mu.Lock()
	captures := len(fx.rt.DumpSeen)
	fx.rt.Mu.Unlock()
	pauses := fx.rt.Tasks.Pauses()
	if pauses != 2 || captures != 2 {
		t.Fatalf("test setup: the deadline did not fall mid-capture (%d pauses, %d captures)", pauses, captures)
	}
	if p := fx.rt.Tasks.AnyPaused(); len(p) > 0 {
		t.Fatalf("returned with %v paused", p)
	}
	if got := ckpttest.Entries(t, fx.dir); len(got) != 0 {
		t.Fatalf("returned with %v in the output", got)
	}
	close(fx.rt.HoldDump)
	fx.cap.Wait()
	assertClean(t, fx, "after the late capture ended")
}

// A deadline too close to pause and resume in time: refused, nothing paused.
func TestCheckpointPodDeadlineTooShort(t *testing.T) {
	fx := withMarginBase(t, time.Second)
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 1500*time.Millisecond), ckpttest.CpReq(fx.dir, "c1", "c2"))
	if status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("got %v", err)
	}
	if fx.rt.Tasks.Pauses() != 0 {
		t.Fatal("paused although the deadline left no time")
	}
	assertClean(t, fx, "after a refused short deadline")
}

// containerd refuses the resume (restarting): the call fails, the record
// stays, and Run resumes the containers once containerd answers again.
func TestResumeFailureIsRetried(t *testing.T) {
	fx := newFixture(t)
	fx.rt.Tasks.FailResumes(2)
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2"))
	if err == nil {
		t.Fatal("succeeded although the resume failed")
	}
	if len(fx.rt.Tasks.AnyPaused()) == 0 {
		t.Fatal("test setup: expected a container still paused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { fx.cap.Recover(ctx); fx.cap.RetryResumes(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(fx.rt.Tasks.AnyPaused()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still paused: %v", fx.rt.Tasks.AnyPaused())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for time.Now().Before(deadline) && len(ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint"))) > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ckpttest.Entries(t, fx.dir); len(got) != 0 {
		t.Fatalf("left %v", got)
	}
}

// A shim killed between pause and resume: the next one resumes the pod and
// removes the unfinished checkpoint at start.
func TestRestartAfterCrashResumesAndCleans(t *testing.T) {
	fx := newFixture(t)
	fx.rt.Tasks.SetPaused("c1", true)
	fx.rt.Tasks.SetPaused("c2", true)
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
	svc2, err := capture.New(fx.capCfg, fx.rt, fx.rt, fx.rt, fx.log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { svc2.Recover(ctx); svc2.RetryResumes(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(fx.rt.Tasks.AnyPaused()) > 0 || len(ckpttest.Entries(t, fx.dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("paused %v, output %v", fx.rt.Tasks.AnyPaused(), ckpttest.Entries(t, fx.dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if _, err := layout.ReadManifest(other); err != nil {
		t.Fatalf("a complete checkpoint was touched: %v", err)
	}
	if got := ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint")); len(got) != 0 {
		t.Errorf("state left behind: %v", got)
	}
}

func TestConcurrentCheckpointOfOnePodRefused(t *testing.T) {
	fx := newFixture(t)
	fx.rt.HoldDump = make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1"))
		errc <- err
	}()
	for fx.rt.Tasks.IsPaused("c1") == false {
		time.Sleep(time.Millisecond)
	}
	dir2 := filepath.Join(fx.root, "cp2")
	os.Mkdir(dir2, 0o700)
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(dir2, "c2"))
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition {
		t.Fatalf("second checkpoint of the pod: %v", err)
	}
	close(fx.rt.HoldDump)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// withMarginBase is newFixture whose captures keep margin before the
// caller's deadline (and 5 ms per container) to resume.
func withMarginBase(t *testing.T, margin time.Duration) *fixture {
	return newFixtureWith(t, func(rt *ckpttest.Runtime, cfg *Config, ccfg *capture.Config) capture.Tasks {
		ccfg.Timing.MarginBase = margin
		return rt
	})
}
