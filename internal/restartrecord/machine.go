package restartrecord

// The in-place restart's state machine (KEP-5532's, as seen from under the
// kubelet) as one table: which event moves a pod from which phase to which.
// Every phase change goes through Enter.

import (
	"fmt"
	"time"
)

// Event is what moves a pod's restart on.
type Event string

const (
	// EventMatched: a rule (or an orchestrator's command) matched an exit;
	// the old instances are to be stopped while shown running.
	EventMatched Event = "rule matched"
	// EventStopped: the old instances are stopped and the backoff waited
	// out; the kubelet's creates are to be replayed, hidden.
	EventStopped Event = "old instances stopped"
	// EventSwapped: every new instance is up and now shown.
	EventSwapped Event = "new instances shown"
	// EventAbandoned: the sandbox was stopped or is gone; the pod is shown
	// as it is and nothing in it is restarted any more.
	EventAbandoned Event = "abandoned"
)

// machine is the whole state machine: phase -> event -> next phase. A pair
// not in it is refused.
var machine = map[Phase]map[Event]Phase{
	PhaseRunning: {
		EventMatched:   PhaseTerminating,
		EventAbandoned: PhaseRunning,
	},
	PhaseTerminating: {
		EventStopped:   PhaseStartup,
		EventAbandoned: PhaseRunning,
	},
	PhaseStartup: {
		EventSwapped:   PhaseRunning,
		EventAbandoned: PhaseRunning,
	},
}

// Enter moves p by ev: its phase (by the machine), and since when (now).
// A step the machine does not allow changes nothing and is an error.
func (p *Pod) Enter(ev Event, now time.Time) error {
	to, ok := machine[p.Phase][ev]
	if !ok {
		return fmt.Errorf("restartrecord: %q is not a step of a restart in phase %s", ev, p.Phase)
	}
	p.Phase, p.PhaseSince = to, now
	return nil
}
