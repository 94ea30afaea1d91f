package podstate

import "time"

// Observer hears of the in-place restarts the manager carries out, so that
// the pod's status and events in the API server can tell them
// (internal/podstatus). Its methods are called once the step is recorded,
// some with the manager's lock held: they must return at once (queue, never
// wait) and must not call the manager.
type Observer interface {
	// RestartStarted: t's exit matched a rule (or a command); the pod's
	// containers, or t.Container alone for a Restart rule, are restarted in
	// place after t.Delay of backoff.
	RestartStarted(pod PodRef, t Trigger)
	// RestartEnded: the restart t started is over, with outcome.
	RestartEnded(pod PodRef, t Trigger, outcome Outcome)
	// WarmRestart: a container of a pod that asks for warm restarts was
	// restored from a checkpoint, or started cold (r.Cold says why).
	WarmRestart(pod PodRef, r WarmResult)
}

// PodRef names the pod an Observer hears about.
type PodRef struct {
	Namespace, Name, UID string
}

// Outcome is how a restart ended.
type Outcome int

const (
	// Restarted: the new instances run and are shown.
	Restarted Outcome = iota
	// RestartedAgain: the new instances are shown, and one of them already
	// exited and started the next restart (RestartStarted came first).
	RestartedAgain
	// Abandoned: the pod is being stopped (or its sandbox is gone); the
	// restart was given up.
	Abandoned
)

// Observe sets the observer of restarts. Call before serving.
func (m *Manager) Observe(o Observer) { m.observer = o }

func refOf(p *Pod) PodRef { return PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID} }

type noObserver struct{}

func (noObserver) RestartStarted(PodRef, Trigger)        {}
func (noObserver) RestartEnded(PodRef, Trigger, Outcome) {}
func (noObserver) WarmRestart(PodRef, WarmResult)        {}

// PodState is a tracked pod's restart state, for an observer that catches
// up (Snapshot): what it heard before the shim restarted may not have
// reached the API server.
type PodState struct {
	Pod PodRef
	// Restarting: a restart is in progress, started by Trigger.
	Restarting bool
	Trigger    Trigger
	// Since is when the pod entered its current phase.
	Since time.Time
	// RestartedAll: the pod restarted all its containers in place before.
	RestartedAll bool
}

// Snapshot is the restart state of every tracked pod whose sandbox runs.
func (m *Manager) Snapshot() []PodState {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PodState, 0, len(m.pods))
	for _, p := range m.pods {
		if p.Stopped {
			continue
		}
		s := PodState{Pod: refOf(p), Since: p.PhaseSince, RestartedAll: p.Restarts > 0}
		if p.Phase != PhaseRunning && p.Trigger != nil {
			s.Restarting, s.Trigger = true, *p.Trigger
		}
		out = append(out, s)
	}
	return out
}
