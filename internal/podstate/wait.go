package podstate

import (
	"context"
	"fmt"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// signal is a broadcast: a channel from wait is closed at the next fire.
// Take the channel before checking the condition waited for, so that a fire
// in between is not missed.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// waitIdle returns once the sandbox has no restart in progress: woken by the
// phase changes themselves (fire).
func (m *Manager) waitIdle(ctx context.Context, sandboxID string) error {
	for {
		changed := m.phaseChanged.wait()
		m.mu.Lock()
		p := m.pods[sandboxID]
		busy := p != nil && p.Phase != PhaseRunning
		m.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Without the event feed an exit is only seen by asking: waitFor asks this
// often then. With the feed it asks again at each exit the feed reports, and
// every second as a safety net.
const (
	pollWithoutFeed = 100 * time.Millisecond
	pollWithFeed    = time.Second
)

// waitFor waits until a started container runs (or, with exit, has exited),
// or the pod's restart leaves Startup (abandoned).
func (m *Manager) waitFor(ctx context.Context, id string, exit bool) (*runtimeapi.ContainerStatus, error) {
	deadline := m.clock.Now().Add(30 * time.Second)
	for {
		exited, changed := m.exitSeen.wait(), m.phaseChanged.wait()
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", id, err)
		}
		s := st.GetStatus()
		switch {
		case !m.inPhase(m.sandboxOf(id), PhaseStartup):
			return s, nil
		case s.State == runtimeapi.ContainerState_CONTAINER_EXITED:
			return s, nil
		case !exit && s.State == runtimeapi.ContainerState_CONTAINER_RUNNING:
			return s, nil
		case !exit && m.clock.Now().After(deadline):
			return s, nil // up or not, the kubelet will judge it once it is shown
		}
		poll := pollWithoutFeed
		if m.eventsLive() != 0 {
			poll = pollWithFeed
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-exited:
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}
