package podstate

import (
	"time"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// Holds: what the kubelet was shown running stays running for the reads
// that follow that showing, across a swap.

// ObservePodSandboxStatus counts the kubelet's reads of a tracked pod: its
// PLEG reads a pod as PodSandboxStatus and then ContainerStatus of every
// container its last list showed (kuberuntime_manager.go GetPodStatus), one
// pod at a time, one list at a time (pleg/generic.go: Relist and relistPod
// run in one goroutine). So the ContainerStatus calls that follow the n-th
// PodSandboxStatus of a pod belong to one list, and that list was served
// before the n-th PodSandboxStatus arrived. The proxy calls it only while a
// pod is tracked (HookActive).
func (m *Manager) ObservePodSandboxStatus(req []byte) {
	id, err := wire.PeekSandboxStatusID(req)
	if err != nil {
		return
	}
	if v, ok := m.reads.Load(id); ok {
		r := v.(*restartrecord.Reads)
		r.At.Store(m.clock.Now().UnixNano())
		n := r.N.Add(1)
		if m.debug { // the arguments would be boxed on every read otherwise
			m.trace(id, traceKubeRead, "reads", n)
		}
	}
}

// readWindow bounds how long the kubelet takes to read one pod: from its
// PodSandboxStatus to the last ContainerStatus of that pod's read, a few
// calls in a row (under 0.1 s seen at a load average of 15 on 2 vCPUs; each
// may wait for a step's state write). Until it passes, the kubelet's status
// shows the replaced instance running as the container's last state.
const readWindow = 5 * time.Second

// heldLocked says whether a replaced instance is still shown running (see
// Instance.HeldUntil), dropping a hold that is over. A hold lasts while a read of
// the pod may still belong to a list served before the swap: a read in
// progress at the swap began at or before heldAt, the first read after it is
// the last that can. So it ends once a second read has begun since the swap,
// or the first one began readWindow ago (its reads are done), or maxHold
// passed. Lists show the instance running for as long as the hold lasts, so
// the list after it shows it exited: that change makes the kubelet read the
// pod again and record the instance's real end. m.mu held.
func (m *Manager) heldLocked(p *restartrecord.Pod, in *restartrecord.Instance) bool {
	if in == nil || !in.Held() {
		return false
	}
	now := m.clock.Now()
	at, reads := in.HeldAt, p.Reads.N.Load()
	if p.Stopped || !now.Before(in.HeldUntil) || reads >= at+2 ||
		(reads == at+1 && now.Sub(time.Unix(0, p.Reads.At.Load())) >= readWindow) {
		in.EndHold()
		m.pods.Recheck() // it may now be quiet (Records.Quiet)
		return false
	}
	return true
}
