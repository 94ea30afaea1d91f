// Package capturetest is containerd's task service for tests of the
// checkpoint capture: a paused flag per container, pauses that fail on
// demand and resumes that fail a given number of times, as containerd's do
// while it restarts.
package capturetest

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tasks is the pause half of capture.Tasks.
type Tasks struct {
	mu          sync.Mutex
	paused      map[string]bool
	failPause   map[string]bool
	noFreeze    map[string]int // this many pauses of the container fail as runc's freezer does
	failResumes int            // this many Resume calls fail before they work
	pauses      int
	asked       int // Paused calls
}

// NewTasks is a task service with every container running.
func NewTasks() *Tasks {
	return &Tasks{paused: map[string]bool{}, failPause: map[string]bool{}, noFreeze: map[string]int{}}
}

// Pause pauses container id, or fails as FailPause asked.
func (t *Tasks) Pause(_ context.Context, id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failPause[id] {
		return status.Error(codes.Unknown, "fake: cannot pause")
	}
	if t.noFreeze[id] > 0 {
		// runc thaws the cgroup again before it answers.
		t.noFreeze[id]--
		return status.Error(codes.Unknown, "OCI runtime pause failed: unable to freeze")
	}
	t.paused[id] = true
	t.pauses++
	return nil
}

// Resume resumes container id; runc refuses to resume a running one.
func (t *Tasks) Resume(_ context.Context, id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failResumes > 0 {
		t.failResumes--
		return status.Error(codes.Unavailable, "fake: containerd is restarting")
	}
	if !t.paused[id] {
		return status.Error(codes.FailedPrecondition, "cannot resume a running process")
	}
	t.paused[id] = false
	return nil
}

// Paused reports whether container id is paused, counting the question.
func (t *Tasks) Paused(_ context.Context, id string) (bool, error) {
	t.mu.Lock()
	t.asked++
	t.mu.Unlock()
	return t.IsPaused(id), nil
}

// PausedAsked counts the Paused calls.
func (t *Tasks) PausedAsked() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.asked
}

// IsPaused reports whether container id is paused.
func (t *Tasks) IsPaused(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.paused[id]
}

// SetPaused sets container id's state, as a capture that ends after its
// caller resumed does (CRIU puts the freezer back as it found it).
func (t *Tasks) SetPaused(id string, p bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.paused[id] = p
}

// AnyPaused lists the paused containers.
func (t *Tasks) AnyPaused() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id, p := range t.paused {
		if p {
			out = append(out, id)
		}
	}
	return out
}

// Pauses counts the pauses that worked.
func (t *Tasks) Pauses() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pauses
}

// FailPause makes every pause of container id fail.
func (t *Tasks) FailPause(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failPause[id] = true
}

// FailFreeze makes the next n pauses of container id fail as runc's
// cgroup v1 freezer does when the cgroup stays FREEZING: containerd's
// Unknown "OCI runtime pause failed: unable to freeze", the container left
// running.
func (t *Tasks) FailFreeze(id string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.noFreeze[id] = n
}

// FailResumes makes the next n resumes fail.
func (t *Tasks) FailResumes(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failResumes = n
}
