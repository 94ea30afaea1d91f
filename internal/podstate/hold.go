package podstate

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// A container the pod's orchestrator terminated (pod management's
// TerminateContainer) is held: the pod's restart rules leave its exits alone,
// so it stays terminated until the orchestrator restarts it (RestartContainer,
// or RestartAllContainers for the whole pod). Pod.Held records it, durably,
// before the container is stopped, so a restarted shim keeps it too.

// HoldContainer holds (hold true) a container of a tracked pod, or releases
// it. It returns once the change is written; on an error nothing changed.
func (m *Manager) HoldContainer(_ context.Context, sandboxID, container string, hold bool) error {
	err := m.update(sandboxID, func(p *restartrecord.Pod) error {
		p.SetHeld(container, hold)
		return nil
	})
	if errors.Is(err, errNotTracked) && !hold {
		return nil
	}
	return err
}

// restartHeld restarts a held container whose newest instance exited, in
// place, as a Restart rule would (its backoff applies). handled is false when
// the container is not held or its newest instance is not exited (the
// caller's refusal stands).
func (m *Manager) restartHeld(ctx context.Context, p *restartrecord.Pod, name, reason string) (handled bool, err error) {
	held, id := false, ""
	m.with(p.SandboxID, func(p *restartrecord.Pod) {
		if p != nil {
			held, id = p.Held[name], p.Latest[name]
		}
	})
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
	err = m.update(p.SandboxID, func(p *restartrecord.Pod) error {
		in := p.Inst(id)
		switch {
		case p.Stopped:
			return errors.New("the pod is terminating")
		case p.Phase != restartrecord.PhaseRunning:
			return fmt.Errorf("a restart of the pod is already in progress (%s)", p.Phase)
		case !p.Held[name] || p.Latest[name] != id || in == nil:
			return errors.New("the container changed meanwhile; try again")
		}
		// The exit is classified once more, as a forced Restart: unsettled
		// and no longer held for this one step.
		p.SetHeld(name, false)
		in.Settled = false
		p.Force(name, string(corev1.ContainerRestartRuleActionRestart))
		if ok, err := m.classifyLocked(s); err != nil || !ok {
			if err == nil {
				err = errors.New("the restart machinery did not take the container")
			}
			return err
		}
		// The kubelet saw this instance exit (the orchestrator's code): it
		// is not shown running again while the restart runs.
		in = p.Inst(id)
		in.Shown = false
		return nil
	})
	if err != nil {
		return true, err
	}
	m.log.Info("podstate: restarting a held container on command", "pod", p.Namespace+"/"+p.Name, "container", name, "reason", reason)
	return true, nil
}
