package podstate

import (
	"context"
	"time"
)

// The in-place restart of one pod as an explicit state machine: a phase
// (Pod.Phase, persisted) and the events that move it. Every phase change goes
// through fire, under m.mu; the step of each phase is run by the pod's
// executor (execute), and every step is safe to repeat, so a shim killed in
// any phase resumes from the recorded phase (replay.go).
//
//	phase                  event        next phase             executor step in the next phase
//	Running                RuleMatched  TerminatingForRestart  terminate: stop the old instances, wait out the backoff
//	TerminatingForRestart  Stopped      Startup                replay: create and start the containers again, hidden
//	Startup                Swapped      Running                none: new instances shown at once (swap)
//	any                    Abandoned    Running                none: the pod is shown as it is, and never restarted again
//
// What the kubelet is shown in each phase is view.go's.

// Event moves a pod from one phase to the next (transitions).
type Event string

const (
	// EventRuleMatched: an exit matched a restart rule, or a command forced
	// one (classifyLocked).
	EventRuleMatched Event = "RuleMatched"
	// EventStopped: the old instances are stopped and the backoff delay is
	// over (terminate).
	EventStopped Event = "Stopped"
	// EventSwapped: the new instances are up and shown (swap).
	EventSwapped Event = "Swapped"
	// EventAbandoned: the kubelet stopped the sandbox, or it is gone (abandon).
	EventAbandoned Event = "Abandoned"
)

// transitions is phase × event → next phase. An event a phase has no entry
// for changes nothing.
var transitions = map[Phase]map[Event]Phase{
	PhaseRunning:     {EventRuleMatched: PhaseTerminating, EventAbandoned: PhaseRunning},
	PhaseTerminating: {EventStopped: PhaseStartup, EventAbandoned: PhaseRunning},
	PhaseStartup:     {EventSwapped: PhaseRunning, EventAbandoned: PhaseRunning},
}

// steps is the executor's work in each phase; it ends with the event that
// leaves the phase, or an error (retried).
var steps = map[Phase]func(m *Manager, ctx context.Context, sandboxID string) error{
	PhaseTerminating: (*Manager).terminate,
	PhaseStartup:     (*Manager).replay,
}

// nextPhase is the phase event ev leads to from phase from; ok is false when
// the event does not apply there.
func nextPhase(from Phase, ev Event) (to Phase, ok bool) {
	to, ok = transitions[from][ev]
	return to, ok
}

// fire applies event ev to p and wakes every wait on a phase change. It
// reports whether the phase changed. m.mu held.
func (m *Manager) fire(p *Pod, ev Event) bool {
	to, ok := nextPhase(p.Phase, ev)
	if !ok {
		return false
	}
	p.Phase, p.PhaseSince = to, m.clock.Now()
	m.phaseChanged.fire()
	return true
}

// execute runs the steps of the pod's restart in progress from its recorded
// phase to its swap, or until a step fails (retried by Run every second). A
// restart the swap itself starts (a new instance that crashed at once) is
// the next execute's.
func (m *Manager) execute(ctx context.Context, sandboxID string) error {
	for {
		phase, ok := m.phaseOf(sandboxID)
		step := steps[phase]
		if !ok || step == nil {
			return nil
		}
		if err := step(m, ctx, sandboxID); err != nil {
			return err
		}
		if now, _ := m.phaseOf(sandboxID); now == phase || phase == PhaseStartup {
			return nil
		}
	}
}

func (m *Manager) phaseOf(sandboxID string) (Phase, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[sandboxID]
	if p == nil {
		return "", false
	}
	return p.Phase, true
}

// terminate is the step of TerminatingForRestart: the instances to show are
// checked against the runtime (refineFake), the old instances still running
// are stopped, and the backoff delay is waited out.
func (m *Manager) terminate(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	if p == nil {
		m.mu.Unlock()
		return nil
	}
	notBefore := p.NotBefore
	// Only instances not yet seen exited need stopping: a CRI container
	// never runs again once it has exited.
	old := make(map[string]string, len(p.Old))
	for id, n := range p.Old {
		if !p.Dead[id] {
			old[id] = n
		}
	}
	m.mu.Unlock()
	if err := m.refineFake(ctx, sandboxID); err != nil {
		return err
	}
	if err := m.stopAll(ctx, old); err != nil {
		return err
	}
	if wait := notBefore.Sub(m.clock.Now()); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Not saved here: the first create's intent is saved with it before
	// anything is created. A shim killed in between resumes in
	// Terminating, whose steps are all done and repeat as no-ops.
	m.fire(p, EventStopped)
	return nil
}
