package ckptstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/goroutinetest"
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
	fx.rt.Mu.Lock()
	fx.rt.HoldDump = hold
	fx.rt.Mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := fx.cap.CheckpointPod(ctx, ckpttest.CpReq(dir, "c1", "c2")); status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", err)
	}
	pauses := fx.rt.Tasks.Pauses()
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
				_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(dir, "c1", "c2"))
				errc <- err
			}()
			// The leftover capture ends while the retry waits for it.
			goroutinetest.WaitBlocked(t, "capture.(*Service).claim")
			release()
			if err := <-errc; err != nil {
				t.Fatalf("retry: %v", err)
			}
			fx.cap.Wait()
			m, err := layout.ReadManifest(dir)
			if err != nil {
				t.Fatalf("the retry's checkpoint is not complete: %v", err)
			}
			for _, c := range m.Containers {
				if _, err := os.Stat(filepath.Join(dir, c.Archive)); err != nil {
					t.Fatalf("archive of %s: %v", c.Name, err)
				}
			}
			if p := fx.rt.Tasks.AnyPaused(); len(p) > 0 {
				t.Fatalf("%v left paused", p)
			}
			if got := ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint")); len(got) != 0 {
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
	pauses := fx.rt.Tasks.Pauses()
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 300*time.Millisecond), ckpttest.CpReq(fx.dir, "c1"))
	if status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("retry while the leftover runs: %v, want Unavailable", err)
	}
	if fx.rt.Tasks.Pauses() != pauses {
		t.Fatal("the refused retry paused a container")
	}
	release()
	fx.cap.Wait()
	assertClean(t, fx, "after the leftover ended")
}

// A record left by an earlier call whose resume is still pending is not
// removed by a later call of the same sandbox.
func TestFrozenRecordsArePerCall(t *testing.T) {
	fx := newFixture(t)
	old := leaveFrozenRecord(t, fx, `{"sandboxId":"sb1","containers":["c2"],"started":1}`)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("a later call removed an earlier call's record: %v", err)
	}
}

// leaveFrozenRecord writes a frozen record (internal/capture, recovery.go)
// as an earlier call left it, and returns its path.
func leaveFrozenRecord(t *testing.T, fx *fixture, record string) string {
	t.Helper()
	p := filepath.Join(fx.stateDir, "checkpoint", "sb1.1.frozen.json")
	if err := os.WriteFile(p, []byte(record), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
