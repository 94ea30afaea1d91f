package criu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// abandon runs a CheckpointPod of c1 and c2 into dir whose deadline expires
// while containerd still captures (the fake holds captures until release).
//
// The call returns while its captures may not have reached containerd yet:
// they run in goroutines of their own, which a loaded machine may schedule
// well after the deadline. So the fake holds every capture until release,
// not only those begun before the call returned (a capture let through then
// would end at once and the leftover work with it); once released, the
// closed channel lets later captures through. The deadline leaves the call
// time to get to the pause on a loaded machine under -race (150 ms did not:
// the call refused it as too short, nothing paused, no leftover); held
// captures make it expire mid-capture whatever its length.
func abandon(t *testing.T, fx *fixture, dir string) (release func()) {
	t.Helper()
	hold := make(chan struct{})
	fx.rt.mu.Lock()
	fx.rt.holdDump = hold
	fx.rt.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := fx.svc.CheckpointPod(ctx, cpReq(dir, "c1", "c2")); status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", err)
	}
	fx.rt.tasks.mu.Lock()
	pauses := fx.rt.tasks.pauses
	fx.rt.tasks.mu.Unlock()
	if pauses != 2 {
		t.Fatalf("test setup: the deadline did not fall mid-capture (%d pauses)", pauses)
	}
	return func() { close(hold) }
}

// A checkpoint abandoned at its deadline and retried at once, into the same
// directory or another one: the retry waits for the leftover work, and gives
// a complete checkpoint and running containers; nothing the leftover does
// afterwards touches it.
func TestRetryAfterAbandonedCheckpoint(t *testing.T) {
	for _, sameDir := range []bool{true, false} {
		t.Run(map[bool]string{true: "same output_path", false: "other output_path"}[sameDir], func(t *testing.T) {
			fx := newFixture(t)
			release := abandon(t, fx, fx.dir)
			dir := fx.dir
			if !sameDir {
				dir = filepath.Join(fx.root, "retry")
				os.Mkdir(dir, 0o700)
			}
			errc := make(chan error, 1)
			go func() {
				_, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(dir, "c1", "c2"))
				errc <- err
			}()
			// The leftover capture ends while the retry is waiting or running.
			time.Sleep(50 * time.Millisecond)
			release()
			if err := <-errc; err != nil {
				t.Fatalf("retry: %v", err)
			}
			fx.svc.inflight.Wait()
			m, err := layout.ReadManifest(dir)
			if err != nil {
				t.Fatalf("the retry's checkpoint is not complete: %v", err)
			}
			for _, c := range m.Containers {
				if _, err := os.Stat(filepath.Join(dir, c.Archive)); err != nil {
					t.Fatalf("archive of %s: %v", c.Name, err)
				}
			}
			if p := fx.rt.tasks.anyPaused(); len(p) > 0 {
				t.Fatalf("%v left paused", p)
			}
			if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 0 {
				t.Fatalf("records left: %v", got)
			}
		})
	}
}

// A retry whose deadline ends before the leftover work does: refused with
// Unavailable before anything is paused, and the leftover still cleans up.
func TestRetryDeadlineWhileLeftoverRuns(t *testing.T) {
	fx := newFixture(t)
	release := abandon(t, fx, fx.dir)
	pauses := fx.rt.tasks.pauses
	_, err := fx.svc.CheckpointPod(ctxT(t, 300*time.Millisecond), cpReq(fx.dir, "c1"))
	if status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("retry while the leftover runs: %v, want Unavailable", err)
	}
	if fx.rt.tasks.pauses != pauses {
		t.Fatal("the refused retry paused a container")
	}
	release()
	fx.svc.inflight.Wait()
	assertClean(t, fx, "after the leftover ended")
}

// A record left by an earlier call whose resume is still pending is not
// removed by a later call of the same sandbox.
func TestFrozenRecordsArePerCall(t *testing.T) {
	fx := newFixture(t)
	old := frozenRecord{SandboxID: "sb1", Containers: []string{"c2"}, Started: 1}
	if err := fx.svc.writeFrozen(old); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(fx.dir, "c1")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fx.svc.frozenPath(old)); err != nil {
		t.Fatalf("a later call removed an earlier call's record: %v", err)
	}
}

// A shim restarted while containerd still captures a container it had paused
// waits for that capture to end before resuming (the capture would freeze the
// container again when it ends).
func TestRestartWaitsForRunningCapture(t *testing.T) {
	fx := newFixture(t)
	fx.rt.tasks.setPaused("c1", true)
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: []string{"c1"}, Started: 1}); err != nil {
		t.Fatal(err)
	}
	capturing := true
	fx.svc.captureRunning = func(id string) bool { return capturing && id == "c1" }
	fx.svc.resumeRecorded(context.Background())
	if !fx.rt.tasks.isPaused("c1") {
		t.Fatal("resumed while containerd still captured the container")
	}
	capturing = false
	fx.svc.resumeRecorded(context.Background())
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
	fx.rt.tasks.setPaused("c1", true)
	os.WriteFile(filepath.Join(fx.dir, layout.IncompleteFile), nil, 0o600)
	os.WriteFile(filepath.Join(fx.dir, "pages-1.img"), []byte("being written"), 0o600)
	out, _ := filepath.EvalSymlinks(fx.dir)
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: []string{"c1"}, OutputPath: out, Started: 1}); err != nil {
		t.Fatal(err)
	}
	capturing := make(chan bool, 1)
	capturing <- true
	fx.svc.captureRunning = func(string) bool {
		v := <-capturing
		capturing <- v
		return v
	}
	fx.svc.retryEvery = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fx.svc.Run(ctx); close(done) }()
	time.Sleep(50 * time.Millisecond)
	if got := entries(t, fx.dir); len(got) != 2 || !fx.rt.tasks.isPaused("c1") {
		t.Fatalf("touched while containerd captures: output %v, paused %v", got, fx.rt.tasks.isPaused("c1"))
	}
	<-capturing
	capturing <- false
	deadline := time.Now().Add(5 * time.Second)
	for len(entries(t, fx.dir)) > 0 || fx.rt.tasks.isPaused("c1") {
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
	fx.rt.tasks.setPaused("c1", true)
	if err := fx.svc.writeFrozen(frozenRecord{SandboxID: "sb1", Containers: []string{"c1"}, OutputPath: out, Started: 1}); err != nil {
		t.Fatal(err)
	}
	// A call of the same sandbox is running: the pass leaves the record.
	j, err := fx.svc.claim(ctxT(t, time.Second), "sb1", filepath.Join(fx.root, "other"), 0)
	if err != nil {
		t.Fatal(err)
	}
	fx.svc.resumeRecorded(context.Background())
	fx.svc.mu.Lock()
	pending := fx.svc.pendingResume
	fx.svc.mu.Unlock()
	if !fx.rt.tasks.isPaused("c1") || !pending {
		t.Fatalf("a record of a held sandbox was acted on or dropped from the retry (paused %v, pending %v)", fx.rt.tasks.isPaused("c1"), pending)
	}
	fx.svc.release(j)
	// Meanwhile a later call left a complete checkpoint in the directory.
	if err := writeManifest(out, &layout.Manifest{FormatVersion: layout.Version, Containers: []layout.ContainerEntry{{Name: "app", Archive: layout.ArchiveName("app")}}}); err != nil {
		t.Fatal(err)
	}
	fx.svc.resumeRecorded(context.Background())
	if fx.rt.tasks.isPaused("c1") {
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
	fx.svc.cleanIncomplete(nil)
	if got := entries(t, out); len(got) != 2 {
		t.Fatalf("a directory a call owns was emptied: %v", got)
	}
	fx.svc.release(j)
	fx.svc.cleanIncomplete(nil)
	if got := entries(t, out); len(got) != 0 {
		t.Fatalf("a marked directory nobody owns was not emptied: %v", got)
	}
}
