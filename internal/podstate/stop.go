package podstate

// Stopping the old instances of a restart, pre-stop hooks included.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// stopAll stops every old instance that still runs, in parallel, as the
// kubelet would: for a graceful termination the preStop exec hook, then
// SIGTERM and SIGKILL after the pod's grace period (StopContainer's timeout);
// for an immediate one no hook and upstream's 2 s window (termination.go).
func (m *Manager) stopAll(ctx context.Context, old map[string]string, term podspec.Termination) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(old))
	for id := range old {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.stopOne(ctx, id, term); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(ch <-chan error) []error {
	var out []error
	for err := range ch {
		out = append(out, err)
	}
	return out
}

func (m *Manager) stopOne(ctx context.Context, id string, term podspec.Termination) error {
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status of %s: %w", id, err)
	}
	s := st.GetStatus()
	if s.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	grace := defaultGracePeriod
	if v, err := strconv.ParseInt(s.Annotations[annotationGracePeriod], 10, 64); err == nil && v >= 0 {
		grace = time.Duration(v) * time.Second
	}
	start := m.clock.Now()
	if h := s.Annotations[annotationPreStop]; h != "" && term != podspec.TerminationImmediate {
		m.runPreStop(ctx, id, h, grace)
	}
	timeout := stopTimeout(term, grace, m.clock.Now().Sub(start))
	m.traceContainer(id, traceStopAsked, "name", s.GetMetadata().GetName(), "timeoutS", int64(timeout/time.Second))
	_, err = m.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(timeout / time.Second)})
	m.traceContainer(id, traceStopped, "name", s.GetMetadata().GetName())
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	return nil
}

// runPreStop runs an exec or sleep preStop hook; HTTP hooks are not run by the
// shim (logged), the container is then stopped with its full grace period.
func (m *Manager) runPreStop(ctx context.Context, id, handlerJSON string, grace time.Duration) {
	var h corev1.LifecycleHandler
	if err := json.Unmarshal([]byte(handlerJSON), &h); err != nil {
		m.log.Warn("podstate: unreadable preStop handler; skipped", "container", id, "err", err)
		return
	}
	switch {
	case h.Exec != nil:
		_, err := m.rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: h.Exec.Command, Timeout: int64(grace / time.Second)})
		if err != nil {
			m.log.Warn("podstate: preStop exec failed", "container", id, "err", err)
		}
	case h.Sleep != nil:
		d := time.Duration(h.Sleep.Seconds) * time.Second
		if d > grace {
			d = grace
		}
		backoff.Sleep(ctx, d)
	default:
		m.log.Warn("podstate: preStop handler type not run by the shim during an in-place restart", "container", id)
	}
}
