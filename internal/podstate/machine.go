package podstate

// Every phase change of a pod goes through enter, which steps it by
// restartrecord's table (Pod.Enter) and wakes the calls waiting for a pod's
// restart to end.

import "github.com/cri-shim/cri-shim/internal/restartrecord"

// enter moves p by ev (Pod.Enter) and wakes the callers waiting for a
// phase change (waitIdle). A step the machine does not allow changes
// nothing and is an error. The caller holds m.mu, and commits p's change
// as each step requires.
func (m *Manager) enter(p *restartrecord.Pod, ev restartrecord.Event) error {
	if err := p.Enter(ev, m.clock.Now()); err != nil {
		return err
	}
	m.changed()
	return nil
}

// changed wakes the waits on phaseWait. The caller holds m.mu.
func (m *Manager) changed() {
	if m.phaseChanged != nil {
		close(m.phaseChanged)
	}
	m.phaseChanged = make(chan struct{})
}

// phaseWait is a channel closed at the next phase change of any pod, or
// instance forgotten. The caller holds m.mu.
func (m *Manager) phaseWait() <-chan struct{} {
	if m.phaseChanged == nil {
		m.phaseChanged = make(chan struct{})
	}
	return m.phaseChanged
}
