package podstate

// The restart's steps, from the pod's recorded phase to the swap, run by
// the engine (engine.go) one sandbox at a time.

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// step performs the next steps of a pod's restart, up to the first that
// must wait: it returns how long (the backoff delay, or the wait for the
// kubelet's removals), and the engine runs it again after that. Every step
// is safe to repeat, so a shim killed at any point finishes the restart
// when it comes back.
func (m *Manager) step(ctx context.Context, sandboxID string) (time.Duration, error) {
	var (
		phase     restartrecord.Phase
		notBefore time.Time
		term      podspec.Termination
		starting  bool // the kubelet is starting an old instance (race.go)
		// Only instances not yet seen exited need stopping: a CRI
		// container never runs again once it has exited.
		old = map[string]string{}
	)
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if p == nil {
			return
		}
		phase, notBefore, term = p.Phase, p.NotBefore, p.Termination
		for id, in := range p.Instances {
			starting = starting || in.Part == restartrecord.PartOld && in.Starting
			if in.Part == restartrecord.PartOld && !in.Dead {
				old[id] = in.Name
			}
		}
	})
	m.trace(sandboxID, traceStep, "phase", phase)
	switch phase {
	case restartrecord.PhaseTerminating:
		if starting {
			return startWait, nil // nothing is stopped until the start has returned
		}
		if err := m.refineShown(ctx, sandboxID); err != nil {
			return 0, err
		}
		if err := m.stopAll(ctx, old, term); err != nil {
			return 0, err
		}
		if wait := notBefore.Sub(m.clock.Now()); wait > 0 {
			m.trace(sandboxID, traceWait, "for", "backoff", "waitMs", wait.Milliseconds())
			return wait, nil
		}
		if wait := m.backlogDelay(sandboxID); wait > 0 {
			m.trace(sandboxID, traceWait, "for", "the kubelet's removals", "waitMs", wait.Milliseconds())
			return wait, nil
		}
		m.with(sandboxID, func(p *restartrecord.Pod) {
			if p != nil && p.Phase == restartrecord.PhaseTerminating {
				// Not saved here: the first create's intent is saved with
				// it before anything is created. A shim killed in between
				// resumes in Terminating, whose steps are all done and
				// repeat as no-ops.
				_ = m.enter(p, restartrecord.EventStopped) // allowed: the phase was just checked
			}
		})
		return 0, m.replay(ctx, sandboxID)
	case restartrecord.PhaseStartup:
		return 0, m.replay(ctx, sandboxID)
	}
	return 0, nil
}

// refineShown drops from the "shown running" set the instances that had in fact
// already exited when the rule matched (other than the trigger). It runs before
// stopAll, so every instance it sees exited exited on its own; nothing is
// stopped until that is recorded.
func (m *Manager) refineShown(ctx context.Context, sandboxID string) error {
	refine, check := false, []string(nil)
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if p == nil || p.Trigger == nil || p.Refined {
			return
		}
		refine = true
		for _, id := range p.ShownIDs() {
			if id != p.Trigger.ContainerID && !p.Inst(id).Dead {
				check = append(check, id)
			}
		}
	})
	if !refine {
		return nil
	}
	var exited []string
	for _, id := range check {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err == nil && st.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			exited = append(exited, id)
		}
	}
	err := m.update(sandboxID, func(p *restartrecord.Pod) error {
		for _, id := range exited {
			if in := p.Inst(id); in != nil {
				in.Shown = false
			}
		}
		p.Refined = true
		return nil
	})
	m.trace(sandboxID, traceRefined, "checked", len(check), "exited", len(exited))
	return err
}

func (m *Manager) ensureStarted(ctx context.Context, id string) error {
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return fmt.Errorf("status of restarted container %s: %w", id, err)
	}
	if st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_CREATED {
		if _, err := m.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
			return fmt.Errorf("start restarted container %s: %w", id, err)
		}
	}
	return nil
}
