package podstate

// The in-place restart's state machine (KEP-5532's, as seen from under the
// kubelet) as one table: which event moves a pod from which phase to which.
// Every phase change goes through enter, which also wakes the calls waiting
// for a pod's restart to end.

import "fmt"

// event is what moves a pod's restart on.
type event string

const (
	// eventMatched: a rule (or an orchestrator's command) matched an exit;
	// the old instances are to be stopped while shown running.
	eventMatched event = "rule matched"
	// eventStopped: the old instances are stopped and the backoff waited
	// out; the kubelet's creates are to be replayed, hidden.
	eventStopped event = "old instances stopped"
	// eventSwapped: every new instance is up and now shown.
	eventSwapped event = "new instances shown"
	// eventAbandoned: the sandbox was stopped or is gone; the pod is shown
	// as it is and nothing in it is restarted any more.
	eventAbandoned event = "abandoned"
)

// machine is the whole state machine: phase -> event -> next phase. A pair
// not in it is refused.
var machine = map[Phase]map[event]Phase{
	PhaseRunning: {
		eventMatched:   PhaseTerminating,
		eventAbandoned: PhaseRunning,
	},
	PhaseTerminating: {
		eventStopped:   PhaseStartup,
		eventAbandoned: PhaseRunning,
	},
	PhaseStartup: {
		eventSwapped:   PhaseRunning,
		eventAbandoned: PhaseRunning,
	},
}

// next is the phase ev moves a pod in phase from to, or an error when the
// machine does not allow ev there.
func next(from Phase, ev event) (Phase, error) {
	to, ok := machine[from][ev]
	if !ok {
		return from, fmt.Errorf("podstate: %q is not a step of a restart in phase %s", ev, from)
	}
	return to, nil
}

// enter moves p by ev (setting its phase and when it began) and wakes the
// callers waiting for a phase change (waitIdle). A step the machine does not
// allow changes nothing and is an error. The caller holds m.mu, and saves p
// (or puts its snapshot back) as each step requires.
func (m *Manager) enter(p *Pod, ev event) error {
	to, err := next(p.Phase, ev)
	if err != nil {
		return err
	}
	p.Phase, p.PhaseSince = to, m.clock.Now()
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
