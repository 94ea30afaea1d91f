package podstate

// The restart's steps run by the pod's executor, from its recorded phase to
// the swap.

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// execute performs the next steps of a pod's restart; every step is safe to
// repeat, so a shim killed at any point finishes the restart when it comes back.
func (m *Manager) execute(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	if p == nil {
		m.mu.Unlock()
		return nil
	}
	phase, notBefore, term := p.Phase, p.NotBefore, p.Termination
	// Only instances not yet seen exited need stopping: a CRI container
	// never runs again once it has exited.
	old := map[string]string{}
	for id, in := range p.Instances {
		if in.Part == PartOld && !in.Dead {
			old[id] = in.Name
		}
	}
	m.mu.Unlock()

	switch phase {
	case PhaseTerminating:
		if err := m.refineShown(ctx, sandboxID); err != nil {
			return err
		}
		if err := m.stopAll(ctx, old, term); err != nil {
			return err
		}
		if wait := notBefore.Sub(m.clock.Now()); wait > 0 {
			if err := m.pause(ctx, wait, nil); err != nil {
				return err // errStopping: resumed in Terminating by the next process
			}
		}
		if err := m.waitBacklog(ctx, sandboxID); err != nil {
			return err
		}
		m.mu.Lock()
		if p.Phase == PhaseTerminating {
			// Not saved here: the first create's intent is saved with it
			// before anything is created. A shim killed in between resumes
			// in Terminating, whose steps are all done and repeat as no-ops.
			_ = m.enter(p, eventStopped) // allowed: the phase was just checked
		}
		m.mu.Unlock()
		return m.replay(ctx, sandboxID)
	case PhaseStartup:
		return m.replay(ctx, sandboxID)
	}
	return nil
}

// pause waits d, or until wake is closed (nil: never); an error when ctx
// ends or the shim stops (errStopping).
func (m *Manager) pause(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.quit:
		return errStopping
	case <-wake:
	case <-t.C:
	}
	return nil
}

// refineShown drops from the "shown running" set the instances that had in fact
// already exited when the rule matched (other than the trigger). It runs before
// stopAll, so every instance it sees exited exited on its own; nothing is
// stopped until that is recorded.
func (m *Manager) refineShown(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	if p == nil || p.Trigger == nil || p.Refined {
		m.mu.Unlock()
		return nil
	}
	var check []string
	for _, id := range p.shownIDs() {
		if id != p.Trigger.ContainerID && !p.inst(id).Dead {
			check = append(check, id)
		}
	}
	m.mu.Unlock()
	for _, id := range check {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil || st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		m.mu.Lock()
		if in := p.inst(id); in != nil {
			in.Shown = false
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p.Refined = true
	if err := m.save(p); err != nil {
		p.Refined = false
		return err
	}
	return nil
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
