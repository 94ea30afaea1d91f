package podstate

// Exits from the shim's event feed.

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// OnEvent takes the runtime's container events (the shim's event feed) so an
// exit is classified the moment it happens; Run's periodic scan covers gaps
// (reconnects, restarts of the shim or of containerd). Only the exited
// container's own status is decoded, and only for a tracked container.
func (m *Manager) OnEvent(e *events.Event) {
	if m.Tracked() == 0 {
		return
	}
	if e.Type != runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT && e.Type != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		return
	}
	if w, ok := m.stateWaits.LoadAndDelete(e.ContainerID); ok {
		close(w.(chan struct{}))
	}
	known := false
	m.withContainer(e.ContainerID, func(p *restartrecord.Pod, _ *restartrecord.Instance) { known = p != nil })
	if !known || e.Type != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		return
	}
	s, err := e.Status()
	if err != nil {
		m.log.Warn("podstate: container event without a readable status", "container", e.ContainerID, "err", err)
		return
	}
	// A verdict that could not be recorded is made again at the next look
	// (save logged it).
	_, _ = m.classifyVia(s, viaEvent)
}
