package podstate

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// ContainerStatus and GetContainerEvents: the pod view (view.go) applied to
// one instance's status, decoded only when the view may change it.

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
	asked := m.epoch.Load()
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if v, ok, err := peekStatus(resp); err == nil && (!ok || !m.statusMayChange(v, asked)) {
		if plain && ok && v.id == id {
			m.keepExited(v, resp)
		}
		return resp, nil
	}
	var r runtimeapi.ContainerStatusResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, errdefs.ErrInternal.WithMessage(fmt.Sprintf("cri-shim: runtime's ContainerStatusResponse: %v", err))
	}
	if err := m.fixStatus(r.GetStatus(), asked); err != nil {
		return nil, unavailable(err)
	}
	return proto.Marshal(&r)
}

// statusMayChange says whether fixStatus could do anything with status v of
// an answer to a request made at epoch asked (view.go, statusMayChange).
func (m *Manager) statusMayChange(v cview, asked uint64) bool {
	if v.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false // fixStatus only ever shows RUNNING
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.statusMayChangeLocked(v, asked)
}

// statusMayChangeLocked is statusMayChange with m.mu held.
func (m *Manager) statusMayChangeLocked(v cview, asked uint64) bool {
	p := m.podOf(v.id)
	return p != nil && statusMayChange(p, v, asked)
}

func (m *Manager) containerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
	next proxy.UnaryNext[runtimeapi.ContainerStatusRequest, runtimeapi.ContainerStatusResponse]) (*runtimeapi.ContainerStatusResponse, error) {
	asked := m.epoch.Load()
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := m.fixStatus(resp.GetStatus(), asked); err != nil {
		return nil, unavailable(err)
	}
	return resp, nil
}

// fixStatus classifies an exit it is the first to see and shows an old
// instance of a restarting pod as still running (statusShownRunning), for a
// status the runtime gave to a request made at epoch asked. An error: the
// exit's verdict could not be recorded, and the status must not be shown.
func (m *Manager) fixStatus(s *runtimeapi.ContainerStatus, asked uint64) error {
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
	p := m.podOf(s.Id)
	if p == nil || s.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	now := m.clock.Now()
	if until, ok := p.held[s.Id]; ok && (!now.Before(until) || p.Stopped) {
		delete(p.held, s.Id)
	}
	if statusShownRunning(p, s.Id, asked, now) {
		s.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		s.FinishedAt, s.ExitCode, s.Reason, s.Message = 0, 0, "", ""
	}
	return nil
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
	for {
		e, err := cs.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if m.Tracked() > 0 && m.dropEvent(e) {
			continue
		}
		if err := send(e); err != nil {
			return err
		}
	}
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
	asked := m.epoch.Load()
	m.mu.Lock()
	p := m.podOf(e.ContainerId)
	if p == nil {
		m.mu.Unlock()
		return false
	}
	hide, fake, _ := instanceView(p, e.ContainerId, asked)
	m.mu.Unlock()
	if hide || fake {
		return true
	}
	for _, s := range e.ContainersStatuses {
		if err := m.fixStatus(s, asked); err != nil {
			return true
		}
	}
	return false
}
