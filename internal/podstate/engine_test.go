package podstate

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// runEngine runs m's engine until the test ends.
func runEngine(t *testing.T, m *Manager) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// until waits for cond (read under m.mu), failing with what after d.
func until(t *testing.T, m *Manager, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		m.mu.Lock()
		ok := cond()
		m.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// steps is how many restart steps are in progress.
func steps(m *Manager) (n int) {
	m.running.Range(func(any, any) bool { n++; return true })
	return n
}

// A restart waiting out its backoff delay holds no goroutine: its step
// returns and the queue hands the sandbox out again when the delay is
// over. A pod removed meanwhile leaves nothing waiting behind.
func TestBackoffDelayWaitsInTheQueue(t *testing.T) {
	for _, how := range []string{"StopPodSandbox", "RemovePodSandbox"} {
		t.Run(how, func(t *testing.T) {
			k := newKubelet(t, t.TempDir())
			m, err := New(k.cri, t.TempDir(), backoff.NewTracker(backoff.Curve{Initial: time.Minute, Max: time.Minute}, nil),
				slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
			if err != nil {
				t.Fatal(err)
			}
			k.m = m
			sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
			id := k.start(sb, "main")
			runEngine(t, m)
			k.exit(id, 1)
			k.status(id)
			p := m.pods.Get(sb)
			until(t, m, 5*time.Second, "the restart never reached its backoff delay", func() bool {
				return p.Phase == restartrecord.PhaseTerminating && steps(m) == 0 && m.queue.NumRequeues(sb) == 0 && p.LastError == ""
			})
			time.Sleep(100 * time.Millisecond)
			if n := steps(m); n != 0 || p.Phase != restartrecord.PhaseTerminating {
				t.Fatalf("%d steps running, phase %s, during the 1-minute delay", n, p.Phase)
			}
			ok := func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
				return &runtimeapi.StopPodSandboxResponse{}, nil
			}
			if how == "StopPodSandbox" {
				if _, err := m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}, ok); err != nil {
					t.Fatal(err)
				}
				if p.Phase != restartrecord.PhaseRunning || !p.Stopped {
					t.Fatalf("after StopPodSandbox: phase %s, stopped %v", p.Phase, p.Stopped)
				}
			} else {
				m.SandboxGone(sb) // the pod table's announcement of RemovePodSandbox
				if m.pods.Get(sb) != nil {
					t.Fatal("the pod is still tracked after its sandbox went")
				}
			}
			// When the delay ends, the step finds nothing to do.
			if _, err := m.step(context.Background(), sb); err != nil || len(k.created()) != 1 {
				t.Fatalf("after %s the step did something: %v, %d creates", how, err, len(k.created()))
			}
		})
	}
}

// A removal of an instance wakes, through the queue, a restart waiting for
// the kubelet's removals: it goes on at once, not when the wait ends.
func TestRemovalQueuesTheWaitingRestart(t *testing.T) {
	k, _, p, first := atTheBacklogLimit(t)
	runEngine(t, k.m)
	created := len(k.created())
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur) // 1 to 6 exited: one too many; the engine takes it from here
	until(t, k.m, 5*time.Second, "the restart never began its wait for removals", func() bool {
		return !p.Backlog.Until.IsZero() && steps(k.m) == 0
	})
	if n := len(k.created()); n != created {
		t.Fatalf("%d instances created while waiting", n-created)
	}
	k.remove(first)
	until(t, k.m, time.Second, "the restart still waits a second after the kubelet removed an instance", func() bool {
		return p.Phase == restartrecord.PhaseRunning && len(k.created()) == created+1
	})
}
