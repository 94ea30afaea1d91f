package restartview

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/wire"
)

// Exited instances of governed pods are asked about again and again: on
// every pod status the kubelet asks ContainerStatus of each instance it
// lists, and twice more when it removes one (kuberuntime_container.go,
// getPodContainerStatuses and removeContainerLog;
// logs/container_log_manager.go). Under a crash loop that is 4 of its 5
// ContainerStatus calls per restart, each a round trip to the runtime for an
// answer that cannot change: an exited container never runs again, and none
// of its status fields moves.
//
// So the runtime's own encoded answer for such an instance is kept and sent
// again, byte for byte, while all of this holds:
//   - the request is plain (not verbose: the verbose info map is the
//     runtime's to recompute);
//   - the instance belongs to a governed pod, and the engine leaves its
//     status as the runtime gave it (Engine.Unchanged, asked again at every
//     use);
//   - the event feed is subscribed, and is the same subscription as when the
//     answer was kept: a removal that bypasses the shim arrives as a
//     CONTAINER_DELETED event (OnEvent drops the answer); after a gap in the
//     feed nothing kept before it is used.
//
// The kubelet's RemoveContainer drops it before and after it is forwarded;
// Run drops answers no call may use again. Other pods' containers are never
// kept: the proxy stays exact for them.
type exitedStatus struct {
	resp []byte // the runtime's ContainerStatusResponse, never modified
	c    wire.Container
	sub  uint64 // event subscription when kept
}

// cachedExited returns the kept answer for a plain ContainerStatus of id,
// or nil when the call must go to the runtime. A miss (every running
// container) asks nothing of the engine.
func (v *View) cachedExited(id string) []byte {
	x, ok := v.exited.Load(id)
	if !ok {
		return nil
	}
	e := x.(*exitedStatus)
	if live := v.live(); live == 0 || live != e.sub || !v.e.Unchanged(e.c) {
		v.exited.CompareAndDelete(id, x)
		return nil
	}
	v.reused.Inc()
	return e.resp
}

// keepExited keeps the runtime's answer resp (status c) for an exited
// instance of a governed pod, when the event feed is subscribed. The caller
// has found that the engine leaves the status as it is.
func (v *View) keepExited(c wire.Container, resp []byte) {
	if c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		return
	}
	live := v.live()
	if live == 0 {
		return
	}
	if e, ok := v.exited.Load(c.ID); ok && e.(*exitedStatus).sub == live {
		return
	}
	if !v.e.Unchanged(c) {
		return
	}
	v.exited.Store(c.ID, &exitedStatus{resp: append([]byte(nil), resp...), c: c, sub: live})
}

// prune drops the kept answers no call may use again (Run).
func (v *View) prune() {
	live := v.live()
	for id, x := range v.exited.Range {
		if e := x.(*exitedStatus); e.sub != live || !v.e.Unchanged(e.c) {
			v.exited.CompareAndDelete(id, x)
		}
	}
}
