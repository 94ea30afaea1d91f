package podstate

import (
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

func refOf(p *restartrecord.Pod) restartapi.PodRef {
	return restartapi.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

type noObserver struct{}

func (noObserver) RestartStarted(restartapi.PodRef, restartapi.Trigger)                   {}
func (noObserver) RestartEnded(restartapi.PodRef, restartapi.Trigger, restartapi.Outcome) {}
func (noObserver) WarmRestart(restartapi.PodRef, restartapi.WarmResult)                   {}

// Snapshot is the restart state of every tracked pod whose sandbox runs.
func (m *Manager) Snapshot() []restartapi.PodState {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]restartapi.PodState, 0, m.pods.Len())
	for _, p := range m.pods.All() {
		if p.Stopped {
			continue
		}
		s := restartapi.PodState{Pod: refOf(p), Since: p.PhaseSince, RestartedAll: p.Restarts > 0}
		if p.Phase != restartrecord.PhaseRunning && p.Trigger != nil {
			s.Restarting, s.Trigger = true, *p.Trigger
		}
		out = append(out, s)
	}
	return out
}
