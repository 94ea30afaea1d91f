package podstate

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Exited instances of tracked pods are asked about again and again: on every
// pod status the kubelet asks ContainerStatus of each instance it lists, and
// twice more when it removes one (kuberuntime_container.go,
// getPodContainerStatuses and removeContainerLog; logs/container_log_manager.go).
// Under a crash loop that is 4 of its 5 ContainerStatus calls per restart,
// each a round trip to the runtime for an answer that cannot change: an
// exited container never runs again, and none of its status fields moves.
//
// So the runtime's own encoded answer for such an instance is kept and sent
// again, byte for byte, while all of this holds:
//   - the request is plain (not verbose: the verbose info map is the
//     runtime's to recompute);
//   - the instance belongs to a tracked pod, and the restart view leaves its
//     status as the runtime gave it (statusMayChangeLocked is false, checked
//     again at every use);
//   - the event feed is subscribed, and is the same subscription as when the
//     answer was kept: a removal that bypasses the shim arrives as a
//     CONTAINER_DELETED event (OnEvent drops the answer); after a gap in the
//     feed nothing kept before it is used.
//
// The kubelet's RemoveContainer drops it before and after it is forwarded;
// reconcile drops answers of instances the runtime no longer lists. Untracked
// pods' containers are never kept: the proxy stays exact for them.
type exitedStatus struct {
	resp []byte // the runtime's ContainerStatusResponse, never modified
	v    cview
	sub  uint64 // event subscription when kept
}

// cachedExited returns the kept answer for a plain ContainerStatus of id, or
// nil when the call must go to the runtime. A miss (every running container)
// takes no lock; a hit is checked again under m.mu.
func (m *Manager) cachedExited(id string) []byte {
	v, ok := m.exited.Load(id)
	if !ok {
		return nil
	}
	e := v.(*exitedStatus)
	m.mu.Lock()
	defer m.mu.Unlock()
	if live := m.eventsLive(); live == 0 || live != e.sub || m.byID[id] == "" || m.statusMayChangeLocked(e.v) {
		m.exited.CompareAndDelete(id, v)
		return nil
	}
	m.metrics.reused.Inc()
	return e.resp
}

// keepExited keeps the runtime's answer resp (status v) for an exited
// instance of a tracked pod, when the event feed is subscribed. The caller
// has found that the view leaves the status as it is.
func (m *Manager) keepExited(v cview, resp []byte) {
	if v.state != runtimeapi.ContainerState_CONTAINER_EXITED {
		return
	}
	live := m.eventsLive()
	if live == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID[v.id] == "" {
		return
	}
	if e, ok := m.exited.Load(v.id); ok && e.(*exitedStatus).sub == live {
		return
	}
	m.exited.Store(v.id, &exitedStatus{resp: append([]byte(nil), resp...), v: v, sub: live})
}

// dropExited forgets the kept answer of a container.
func (m *Manager) dropExited(id string) { m.exited.Delete(id) }

// pruneExited forgets the kept answers of containers the runtime no longer
// lists, or that no tracked pod has. m.mu held.
func (m *Manager) pruneExited(exists map[string]bool) {
	for id := range m.exited.Range {
		if !exists[id.(string)] || m.byID[id.(string)] == "" {
			m.exited.Delete(id)
		}
	}
}
