package podstate

// ContainerStatus and GetContainerEvents through the restart view.

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// containerStatusBytes is containerStatus on the encoded response: only a
// status the view may change (an exit, or an instance shown running) is
// decoded; a running container's passes through as the runtime sent it.
func (m *Manager) ContainerStatusBytes(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	id, plain, perr := peekStatusRequest(req)
	plain = plain && perr == nil
	if plain {
		if b := m.cachedExited(id); b != nil {
			return b, nil
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if v, ok, err := peekStatus(resp); err == nil && (!ok || !m.statusMayChange(v)) {
		if plain && ok && v.id == id {
			m.keepExited(v, resp)
		}
		return resp, nil
	}
	var r runtimeapi.ContainerStatusResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, fmt.Errorf("cri-shim: runtime's ContainerStatusResponse: %w: %w", errdefs.ErrInternal, err)
	}
	if err := m.fixStatus(r.GetStatus()); err != nil {
		return nil, unavailable(err)
	}
	return proto.Marshal(&r)
}

// statusMayChange says whether fixStatus could do anything with this status:
// classify an exit, or show a not-running instance as running.
func (m *Manager) statusMayChange(v cview) bool {
	if v.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false // fixStatus only ever shows RUNNING
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.statusMayChangeLocked(v)
}

// statusMayChangeLocked is statusMayChange with m.mu held.
func (m *Manager) statusMayChangeLocked(v cview) bool {
	if v.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false
	}
	p := m.pods[m.byID[v.id]]
	if p == nil {
		return false
	}
	exited := v.state == runtimeapi.ContainerState_CONTAINER_EXITED
	in := p.inst(v.id)
	if in == nil {
		return false
	}
	if exited && (!in.Dead || m.needsClassification(p, v.id, v.name)) {
		return true
	}
	_, fake := view(p, v.id)
	return fake || in.held()
}

func (m *Manager) containerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
	next proxy.UnaryNext[runtimeapi.ContainerStatusRequest, runtimeapi.ContainerStatusResponse]) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := m.fixStatus(resp.GetStatus()); err != nil {
		return nil, unavailable(err)
	}
	return resp, nil
}

// fixStatus classifies an exit it is the first to see and shows an old
// instance of a restarting pod, or a held one, as still running. An error:
// the exit's verdict could not be recorded, and the status must not be shown.
func (m *Manager) fixStatus(s *runtimeapi.ContainerStatus) error {
	if s == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
		if _, err := m.classifyLocked(s); err != nil {
			return err
		}
	}
	p := m.pods[m.byID[s.Id]]
	if p == nil {
		return nil
	}
	_, fake := view(p, s.Id)
	if !fake && m.heldLocked(p, s.Id) {
		fake = true // listed running before a swap: keep to that list's picture
	}
	if fake {
		s.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		s.FinishedAt, s.ExitCode, s.Reason, s.Message = 0, 0, "", ""
	}
	return nil
}

// view says how the kubelet sees one instance of a tracked pod, from the
// pod's record alone: during a restart, the instances that were running (and
// the trigger) still run, and the new instances do not exist yet. A hold
// (heldLocked) may show a replaced instance running after the swap too, and
// an instance a handed-back restart left behind stays hidden (Instance.Hidden).
// Called with m.mu held.
func view(p *Pod, id string) (hide, fakeRunning bool) {
	in := p.inst(id)
	if in != nil && in.Hidden {
		return true, false
	}
	if p.Phase == PhaseRunning || in == nil {
		return false, false
	}
	if in.Part == PartNew {
		return true, false
	}
	return false, in.Shown
}

// GetContainerEvents relays the runtime's container events to the kubelet
// without the ones the restart view hides (see dropEvent).
func (m *Manager) GetContainerEvents(ctx context.Context, req *runtimeapi.GetEventsRequest,
	send func(*runtimeapi.ContainerEventResponse) error,
	next proxy.StreamNext[runtimeapi.GetEventsRequest, runtimeapi.ContainerEventResponse]) error {
	cs, err := next(ctx, req)
	if err != nil {
		return err
	}
	return proxy.Relay(cs, send, func(e *runtimeapi.ContainerEventResponse) (bool, error) {
		return m.Tracked() == 0 || !m.dropEvent(e), nil
	})
}

// dropEvent says whether an event is kept from the kubelet. An exit whose
// verdict could not be recorded is dropped too: the kubelet's next list is
// answered Unavailable until it is (viewList), so it never sees the exit
// unclassified.
func (m *Manager) dropEvent(e *runtimeapi.ContainerEventResponse) bool {
	for _, s := range e.ContainersStatuses {
		if s.Id != e.ContainerId {
			continue
		}
		if restarts, err := m.classify(s); restarts || err != nil {
			return true
		}
	}
	m.mu.Lock()
	p := m.pods[m.byID[e.ContainerId]]
	if p == nil {
		m.mu.Unlock()
		return false
	}
	hide, fake := view(p, e.ContainerId)
	m.mu.Unlock()
	if hide || fake {
		return true
	}
	for _, s := range e.ContainersStatuses {
		if err := m.fixStatus(s); err != nil {
			return true
		}
	}
	return false
}
