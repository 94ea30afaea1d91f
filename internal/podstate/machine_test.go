package podstate

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// The machine allows exactly the restart's steps: a rule matches a running
// pod, its old instances stop, the new ones are shown; a stopped or gone
// sandbox abandons a restart in any phase. Everything else is refused and
// changes nothing.
func TestMachineAllowsOnlyTheRestartsSteps(t *testing.T) {
	phases := []restartrecord.Phase{restartrecord.PhaseRunning, restartrecord.PhaseTerminating, restartrecord.PhaseStartup}
	evs := []restartrecord.Event{restartrecord.EventMatched, restartrecord.EventStopped, restartrecord.EventSwapped, restartrecord.EventAbandoned}
	want := map[restartrecord.Phase]map[restartrecord.Event]restartrecord.Phase{
		restartrecord.PhaseRunning:     {restartrecord.EventMatched: restartrecord.PhaseTerminating, restartrecord.EventAbandoned: restartrecord.PhaseRunning},
		restartrecord.PhaseTerminating: {restartrecord.EventStopped: restartrecord.PhaseStartup, restartrecord.EventAbandoned: restartrecord.PhaseRunning},
		restartrecord.PhaseStartup:     {restartrecord.EventSwapped: restartrecord.PhaseRunning, restartrecord.EventAbandoned: restartrecord.PhaseRunning},
	}
	m := machineManager(t)
	for _, from := range phases {
		for _, ev := range evs {
			p := &restartrecord.Pod{Phase: from}
			err := m.enter(p, ev)
			to, ok := want[from][ev]
			switch {
			case ok && (err != nil || p.Phase != to || p.PhaseSince.IsZero()):
				t.Errorf("%s --%s--> %s, %v; want %s", from, ev, p.Phase, err, to)
			case !ok && (err == nil || p.Phase != from || !p.PhaseSince.IsZero()):
				t.Errorf("%s --%s--> %s, %v; want refused and unchanged", from, ev, p.Phase, err)
			}
		}
	}
}

func machineManager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(nil, t.TempDir(), backoff.NewTracker(testCurve, nil), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A call waiting for a pod's restart to end (waitIdle) returns when the swap
// enters Running, and not before.
func TestWaitIdleEndsAtThePhaseChange(t *testing.T) {
	m := machineManager(t)
	p := &restartrecord.Pod{SandboxID: "sb", Phase: restartrecord.PhaseStartup}
	m.pods.Add(p)
	done := make(chan error, 1)
	go func() { done <- m.waitIdle(context.Background(), "sb") }()
	select {
	case err := <-done:
		t.Fatalf("returned during the restart: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	m.mu.Lock()
	_ = m.enter(p, restartrecord.EventSwapped)
	m.mu.Unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after the swap")
	}
}

// statusSource answers ContainerStatus from a settable state and counts the calls.
type statusSource struct {
	runtimeService
	mu    sync.Mutex
	state runtimeapi.ContainerState
	calls atomic.Int32
}

func (s *statusSource) ContainerStatus(_ context.Context, in *runtimeapi.ContainerStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls.Add(1) // once the state is read: a count says the look saw it
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: in.ContainerId, State: s.state,
		Metadata: &runtimeapi.ContainerMetadata{Name: "init"}}}, nil
}

// With the event feed live, the replay's wait for an init container to exit
// looks again when the container's stop event arrives, not by polling: one
// look before, one after the event.
func TestWaitForWakesOnTheStopEvent(t *testing.T) {
	m := machineManager(t)
	rt := &statusSource{state: runtimeapi.ContainerState_CONTAINER_RUNNING}
	m.rt = rt
	m.opts.EventsLive = func() uint64 { return 1 }
	m.pods.Add(&restartrecord.Pod{SandboxID: "sb", Phase: restartrecord.PhaseStartup, Instances: map[string]*restartrecord.Instance{"c1": {Name: "init"}}})
	m.tracked.Store(1)
	type result struct {
		s   *runtimeapi.ContainerStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := m.waitFor(context.Background(), "sb", "c1", true)
		done <- result{s, err}
	}()
	// The first look has seen the container running; the exit comes after.
	for deadline := time.Now().Add(5 * time.Second); rt.calls.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("waitFor never looked at the container")
		}
	}
	rt.mu.Lock()
	rt.state = runtimeapi.ContainerState_CONTAINER_EXITED
	rt.mu.Unlock()
	b, _ := proto.Marshal(&runtimeapi.ContainerEventResponse{ContainerId: "c1",
		ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "sb"},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c1", State: runtimeapi.ContainerState_CONTAINER_EXITED,
			Metadata: &runtimeapi.ContainerMetadata{Name: "init"}}}})
	e, err := events.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	m.OnEvent(e)
	select {
	case r := <-done:
		if r.err != nil || r.s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("waitFor = %v, %v", r.s, r.err)
		}
		if took := time.Since(sent); took > stateRecheck/2 {
			t.Fatalf("woke %v after the event", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after the stop event")
	}
	if n := rt.calls.Load(); n != 2 {
		t.Fatalf("%d status looks; want 2 (before and after the event)", n)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	left := 0
	m.stateWaits.Range(func(any, any) bool { left++; return true })
	if left != 0 {
		t.Fatalf("%d waits left behind", left)
	}
}
