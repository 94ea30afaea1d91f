package podstate

// Keeping the records in step with the runtime: restarts abandoned when the
// sandbox is stopped or gone, pods forgotten once removed.

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// abandon records Pod.Abandon and ends the step in progress; when that
// cannot be recorded nothing changes. m.mu held.
func (m *Manager) abandon(p *restartrecord.Pod) error {
	restarting := p.Phase != restartrecord.PhaseRunning && p.Trigger != nil
	if err := m.pods.Update(p, func(p *restartrecord.Pod) error {
		if err := m.enter(p, restartrecord.EventAbandoned); err != nil {
			return err
		}
		p.Abandon()
		return nil
	}); err != nil {
		return err
	}
	m.cancelStep(p.SandboxID)
	if restarting {
		m.traceEnd(p.SandboxID, "abandoned")
		m.opts.Observer.RestartEnded(refOf(p), *p.Trigger, restartapi.Abandoned)
	}
	return nil
}

// abandonIfSandboxGone is called when a restart step failed: if the pod's
// sandbox is gone or no longer ready (stopped or removed by a client that
// bypassed the shim, or by the runtime), retrying would only create
// containers in a dead sandbox, so the restart is abandoned (reconcile drops
// the state of a removed sandbox). A runtime that does not answer changes
// nothing: the step is retried.
func (m *Manager) abandonIfSandboxGone(ctx context.Context, sandboxID string, stepErr error) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ready, err := m.sandboxReady(ctx, sandboxID); err != nil || ready {
		return false
	}
	gone := true
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if p == nil || p.Stopped {
			return
		}
		lastErr, phase := p.LastError, p.Phase
		p.LastError = "restart abandoned, sandbox gone or not ready: " + stepErr.Error()
		if err := m.abandon(p); err != nil {
			// Tried again with the step.
			p.LastError, gone = lastErr, false
			return
		}
		m.log.Warn("podstate: sandbox gone or not ready; restart abandoned", "pod", p.Namespace+"/"+p.Name, "phase", phase, "err", stepErr)
	})
	return gone
}

// reconcile forgets the instances the runtime no longer has (removed
// without going through the shim; the kubelet's removals are seen by
// removeContainer), so a pod's state stays the size of its live containers
// however often it restarts. Sandboxes gone from the runtime are the pod
// table's (internal/podtable): SandboxGone.
func (m *Manager) reconcile(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Only the IDs are read: a whole decode of a large node's list is
	// milliseconds and tens of thousands of allocations, every 10 s.
	cs, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{}, wire.ListKeysOnly())
	if err != nil {
		return // runtime down: keep everything, try again later
	}
	exists := make(map[string]bool, len(cs.Containers))
	for _, c := range cs.Containers {
		exists[c.Id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// In any phase: a crash-looping pod is almost never Running.
	for _, p := range m.pods.All() {
		pruned := false
		for id := range p.Instances {
			if !exists[id] && m.forget(p, id) {
				pruned = true
			}
		}
		if pruned {
			// A record that still names removed instances is harmless; the
			// next save carries the pruning (a failure is logged by save).
			_ = m.pods.Save(p)
		}
	}
}
