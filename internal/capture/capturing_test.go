package capture

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/capture/capturetest"
)

// fakeCaptures is containerd's captures as a test runs them: a capture of a
// container runs from start until end, when, as CRIU does, it puts the
// freezer back as it found it (paused) and its process exits.
type fakeCaptures struct {
	tasks *capturetest.Tasks
	// waiting receives each Wait that begins on a running capture.
	waiting chan RunningCapture

	mu      sync.Mutex
	nextPid int
	running map[int]fakeCapture
}

type fakeCapture struct {
	id     string
	exited chan struct{}
}

func newFakeCaptures(tasks *capturetest.Tasks) *fakeCaptures {
	return &fakeCaptures{tasks: tasks, waiting: make(chan RunningCapture, 16), nextPid: 100, running: map[int]fakeCapture{}}
}

func (f *fakeCaptures) start(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextPid++
	f.running[f.nextPid] = fakeCapture{id: id, exited: make(chan struct{})}
}

// end ends every capture of id.
func (f *fakeCaptures) end(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for pid, c := range f.running {
		if c.id == id {
			f.tasks.SetPaused(id, true)
			close(c.exited)
			delete(f.running, pid)
		}
	}
}

// waitStarted returns once a Wait on a running capture has begun.
func (f *fakeCaptures) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-f.waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("nothing waits for the running capture")
	}
}

func (f *fakeCaptures) Running(ids []string) []RunningCapture {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []RunningCapture
	for pid, c := range f.running {
		for _, id := range ids {
			if c.id == id {
				out = append(out, RunningCapture{ID: id, Pid: pid})
			}
		}
	}
	return out
}

func (f *fakeCaptures) Wait(ctx context.Context, rc RunningCapture) error {
	f.mu.Lock()
	c, ok := f.running[rc.Pid]
	f.mu.Unlock()
	if !ok {
		return nil
	}
	f.waiting <- rc
	select {
	case <-c.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fakeRunc starts a root-owned process whose command line is a runc
// checkpoint of container id (a shell reading its stdin: argv[0] "runc",
// then "checkpoint" and id as the script's arguments); closing the returned
// pipe ends it.
func fakeRunc(t *testing.T, id string) (*exec.Cmd, func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("only root's processes are taken for captures")
	}
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"runc", "-c", "read x", "checkpoint", id}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return cmd, func() { in.Close() }
}

// findCapture waits until the host watch sees the process (the exec of the
// child may not have happened yet).
func findCapture(t *testing.T, h hostCaptures, id string, pid int) RunningCapture {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, c := range h.Running([]string{"other", id}) {
			if c.Pid == pid && c.ID == id {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runc checkpoint of %s (pid %d) not found in /proc", id, pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The host watch finds a runc checkpoint process and its Wait returns when,
// and only when, the process exits: on a pidfd, and by looking at the
// process when there is none.
func TestHostCapturesWaitForExit(t *testing.T) {
	for _, c := range []struct {
		name string
		wait func(h hostCaptures, ctx context.Context, rc RunningCapture) error
	}{
		{"pidfd", hostCaptures.Wait},
		{"polling", hostCaptures.poll},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := hostCaptures{every: 5 * time.Millisecond}
			id := "host-watch-" + c.name
			cmd, exit := fakeRunc(t, id)
			rc := findCapture(t, h, id, cmd.Process.Pid)
			done := make(chan error, 1)
			go func() { done <- c.wait(h, context.Background(), rc) }()
			select {
			case err := <-done:
				t.Fatalf("Wait returned (%v) while the capture runs", err)
			case <-time.After(100 * time.Millisecond):
			}
			exit()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Wait did not return once the capture's process exited")
			}
			// Exited but not yet reaped (a zombie): no longer a capture.
			for _, rc := range h.Running([]string{id}) {
				t.Fatalf("still seen running after its exit: %+v", rc)
			}
		})
	}
}

// Wait on a PID that is not (or no longer) the capture returns at once, as
// for a PID reused after the capture's exit; a Wait on a running capture
// ends with its context.
func TestHostCapturesWaitOtherProcessAndContext(t *testing.T) {
	h := hostCaptures{every: 5 * time.Millisecond}
	if err := h.Wait(context.Background(), RunningCapture{ID: "x", Pid: os.Getpid()}); err != nil {
		t.Fatalf("waiting on a process that is not a capture: %v", err)
	}
	if err := h.poll(context.Background(), RunningCapture{ID: "x", Pid: os.Getpid()}); err != nil {
		t.Fatalf("polling a process that is not a capture: %v", err)
	}
	cmd, _ := fakeRunc(t, "host-watch-ctx")
	rc := findCapture(t, h, "host-watch-ctx", cmd.Process.Pid)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.Wait(ctx, rc); err == nil {
		t.Fatal("Wait on a running capture returned without error when its context ended")
	}
}
