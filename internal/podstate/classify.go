package podstate

// Exits: each exit of a tracked container is classified once against the pod's
// rules; a matching one starts the pod's restart.

import (
	"context"
	"errors"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/wire"
	corev1 "k8s.io/api/core/v1"
)

// scan classifies exits of tracked pods that nobody has asked about yet, so a
// restart starts within a second even if the kubelet is slow to look.
func (m *Manager) scan(ctx context.Context) {
	if m.Tracked() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED}},
	})
	if err != nil {
		return
	}
	vs := make([]wire.Container, len(resp.Containers))
	for i, c := range resp.Containers {
		vs[i] = wire.ContainerOf(c)
	}
	// An exit whose verdict could not be recorded is classified again at
	// the next look (save logged it).
	_ = m.classifyExited(ctx, vs)
}

// classifyExited decides, for exited containers of tracked pods not yet
// classified, whether the exit triggers a pod restart. It fetches exit codes
// outside the lock. An error means a verdict could not be recorded: that
// exit is unclassified still and must not be shown as it is.
func (m *Manager) classifyExited(ctx context.Context, cs []wire.Container) error {
	var need []string
	m.mu.Lock()
	for _, c := range cs {
		if c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			continue
		}
		p := m.pods.Get(c.Sandbox)
		if p == nil {
			continue
		}
		p.MarkDead(c.ID)
		if p.NeedsClassification(c.ID, c.Name) {
			need = append(need, c.ID)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range need {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			continue
		}
		if _, err := m.classify(st.GetStatus()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// forget drops a container instance that no longer exists from the pod's
// record, if it may (Pod.Forgettable), and reports whether it did. m.mu
// held.
func (m *Manager) forget(p *restartrecord.Pod, id string) bool {
	if !p.Forgettable(id) {
		return false
	}
	m.pods.RemoveInstance(p, id)
	m.changed()
	if p.Phase == restartrecord.PhaseTerminating && !p.Backlog.Until.IsZero() && !p.Backlog.Over {
		// Its restart waits for the kubelet's removals (backlog.go): it
		// may go on now. A restart still in its backoff delay is queued
		// for the delay's end already.
		m.kick(p.SandboxID)
	}
	return true
}

// classify records an exited container's verdict and, on a matching rule,
// starts the pod's restart. It reports whether the exit triggered a restart.
// An error means the verdict could not be recorded: nothing changed, nothing
// was started, and the exit is classified again at the next look.
func (m *Manager) classify(s *runtimeapi.ContainerStatus) (restarts bool, err error) {
	return m.classifyVia(s, viaRead)
}

// How an exit reached the shim, for the restart trace (trace.go): the
// runtime's event feed, or a read of the runtime (the kubelet's list or
// status, or the shim's own scan).
const (
	viaEvent = "event"
	viaRead  = "read"
)

// classifyVia is classify of an exit that reached the shim by via.
func (m *Manager) classifyVia(s *runtimeapi.ContainerStatus, via string) (restarts bool, err error) {
	if s == nil || s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		return false, nil
	}
	m.withContainer(s.Id, func(p *restartrecord.Pod, _ *restartrecord.Instance) {
		if p != nil {
			restarts, err = m.classifyLockedVia(s, via)
		}
	})
	return restarts, err
}

// classifyLocked is classify with m.mu held.
func (m *Manager) classifyLocked(s *runtimeapi.ContainerStatus) (bool, error) {
	return m.classifyLockedVia(s, viaRead)
}

// classifyLockedVia is classifyVia with m.mu held.
func (m *Manager) classifyLockedVia(s *runtimeapi.ContainerStatus, via string) (bool, error) {
	p := m.pods.Of(s.Id)
	name := s.GetMetadata().GetName()
	if p == nil {
		return false, nil
	}
	p.MarkDead(s.Id)
	if !p.NeedsClassification(s.Id, name) {
		return p.Phase != restartrecord.PhaseRunning && p.Trigger != nil && p.Trigger.ContainerID == s.Id, nil
	}
	c := m.pods.Begin(p)
	action := p.Rules.Match(name, s.ExitCode)
	if asked := p.Inst(s.Id).StopAsked; !asked.IsZero() && !time.Unix(0, s.FinishedAt).Before(asked) {
		action = "" // the kubelet stopped it (container.go)
	}
	if forced, ok := p.Forced[name]; ok {
		action = corev1.ContainerRestartRuleAction(forced)
		delete(p.Forced, name)
	}
	if action != podspec.ActionRestartAllContainers && action != corev1.ContainerRestartRuleActionRestart {
		p.Settle(s.Id)
		return false, c.Commit(nil)
	}
	now := m.clock.Now()
	finished := time.Unix(0, s.FinishedAt)
	started := time.Unix(0, s.StartedAt)
	key, scope := backoff.Key{PodUID: p.UID}, ""
	if action == corev1.ContainerRestartRuleActionRestart {
		// One container: its own curve, and only its instances take part.
		key.Container, scope = name, name
	}
	if err := m.enter(p, restartrecord.EventMatched); err != nil {
		return false, err
	}
	m.traceBegin(p, finished, via)
	prevBackoff, prevOwner, hadBackoff := m.bo.Get(key)
	bst := m.bo.Exited(key, p.SandboxID, started, finished)
	p.Match(restartapi.Trigger{Container: name, ContainerID: s.Id, ExitCode: s.ExitCode, StartedAt: started, FinishedAt: finished,
		Action: string(action), Delay: bst.LastDelay}, scope, now, bst.NotBefore)
	if err := c.Commit(nil); err != nil {
		// Not started: the curve does not move either.
		if hadBackoff {
			m.bo.Restore(key, prevOwner, prevBackoff)
		} else {
			m.bo.Drop(key)
		}
		return false, err
	}
	if scope == "" {
		m.metrics.restarts.Inc()
	}
	m.metrics.delay.Observe(bst.LastDelay.Seconds())
	m.trace(p.SandboxID, traceMatched, "delay", bst.LastDelay)
	m.opts.Observer.RestartStarted(refOf(p), *p.Trigger)
	m.log.Info("podstate: restart rule matched", "action", action, "trigger", s.Id,
		"pod", p.Namespace+"/"+p.Name, "container", name, "exitCode", s.ExitCode, "delay", bst.LastDelay)
	m.kick(p.SandboxID)
	return true, nil
}
