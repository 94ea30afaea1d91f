package podstate

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A container the pod's orchestrator terminated (pod management's
// TerminateContainer) is held: the pod's restart rules leave its exits alone,
// so it stays terminated until the orchestrator restarts it (RestartContainer,
// or RestartAllContainers for the whole pod). Pod.Held records it, durably,
// before the container is stopped, so a restarted shim keeps it too.

// HoldContainer holds (hold true) a container of a tracked pod, or releases
// it. It returns once the change is written; on an error nothing changed.
func (m *Manager) HoldContainer(_ context.Context, sandboxID, container string, hold bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[sandboxID]
	if p == nil {
		if !hold {
			return nil
		}
		return errors.New("the pod is not tracked by cri-shim's restart machinery")
	}
	if p.Held[container] == hold {
		return nil
	}
	setHeld(p, container, hold)
	if err := m.saveDurable(p); err != nil {
		setHeld(p, container, !hold)
		return err
	}
	return nil
}

func setHeld(p *Pod, container string, hold bool) {
	if !hold {
		delete(p.Held, container)
		return
	}
	if p.Held == nil {
		p.Held = map[string]bool{}
	}
	p.Held[container] = true
}

// saveDurable saves a pod whose change must not be acted on unless written;
// m.mu held.
func (m *Manager) saveDurable(p *Pod) error { return m.save(p) }

// restartHeld restarts a held container whose newest instance exited, in
// place, as a Restart rule would (its backoff applies). handled is false when
// the container is not held or its newest instance is not exited (the
// caller's refusal stands).
func (m *Manager) restartHeld(ctx context.Context, p *Pod, name, reason string) (handled bool, err error) {
	m.mu.Lock()
	held, id := p.Held[name], p.Latest[name]
	m.mu.Unlock()
	if !held || id == "" {
		return false, nil
	}
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return true, err
	}
	s := st.GetStatus()
	if s.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case p.Stopped:
		return true, errors.New("the pod is terminating")
	case p.Phase != PhaseRunning:
		return true, fmt.Errorf("a restart of the pod is already in progress (%s)", p.Phase)
	case !p.Held[name] || p.Latest[name] != id:
		return true, errors.New("the container changed meanwhile; try again")
	}
	// The exit is classified once more, as a forced Restart: unsettled and
	// no longer held for this one step.
	in := p.inst(id)
	if in == nil {
		return true, errors.New("the container changed meanwhile; try again")
	}
	wasSettled := in.Settled
	setHeld(p, name, false)
	in.Settled = false
	if p.Forced == nil {
		p.Forced = map[string]string{}
	}
	p.Forced[name] = string(corev1.ContainerRestartRuleActionRestart)
	if ok, err := m.classifyLocked(s); err != nil || !ok {
		setHeld(p, name, true)
		delete(p.Forced, name)
		in.Settled = wasSettled
		// The rollback puts memory back to what the record already says
		// unless classify saved; a failure here is logged by save and the
		// next save carries it.
		_ = m.save(p)
		if err != nil {
			return true, err
		}
		return true, errors.New("the restart machinery did not take the container")
	}
	// The kubelet saw this instance exit (the orchestrator's code): it is
	// not shown running again while the restart runs.
	in.Shown = false
	if err := m.save(p); err != nil {
		// Memory is right (the restart is recorded); the next save carries
		// this too. Until then a restarted shim may show the exited
		// instance as running while the restart runs.
		m.log.Warn("podstate: recording that a held container's exit is shown", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
	m.log.Info("podstate: restarting a held container on command", "pod", p.Namespace+"/"+p.Name, "container", name, "reason", reason)
	return true, nil
}
