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
)

// A pod removed while its restart waits out a long backoff delay leaves no
// executor behind: the wait ends with the pod, not with the delay.
func TestRemovedPodStopsItsExecutor(t *testing.T) {
	for _, how := range []string{"StopPodSandbox", "RemovePodSandbox"} {
		t.Run(how, func(t *testing.T) {
			k := newKubelet(t, t.TempDir())
			m, err := New(k.cri, t.TempDir(), backoff.NewTracker(backoff.Curve{Initial: time.Minute, Max: time.Minute}, nil),
				slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			k.m = m
			sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
			id := k.start(sb, "main")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { m.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			k.exit(id, 1)
			k.status(id)
			executors := func() int {
				m.mu.Lock()
				defer m.mu.Unlock()
				return len(m.active)
			}
			for deadline := time.Now().Add(5 * time.Second); executors() == 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("test setup: no executor waiting out the delay")
				}
			}
			ok := func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
				return &runtimeapi.StopPodSandboxResponse{}, nil
			}
			if how == "StopPodSandbox" {
				if _, err := m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}, ok); err != nil {
					t.Fatal(err)
				}
			} else {
				m.SandboxGone(sb) // the pod table's announcement of RemovePodSandbox
			}
			for deadline := time.Now().Add(time.Second); executors() != 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("after %s the executor still waits out the 1-minute delay", how)
				}
			}
		})
	}
}
