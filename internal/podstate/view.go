package podstate

import (
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The pod view: what the kubelet is shown of a tracked pod's containers in
// ListContainers, ContainerStatus and container events. Everything here is a
// pure function of a pod's record and of the runtime's answer; the callers
// hold m.mu and apply the verdicts.
//
// During a restart the kubelet sees the instances that were running (and the
// triggering one) still running, and none of the new instances, until the
// swap shows the new ones at once. The kubelet validates every status update
// against the last one it published (pkg/kubelet/status/status_manager.go,
// checkContainerStateTransition): under restartPolicy Never a container it has
// published terminated may never become running again. So the view must never
// show an intermediate state, in particular the old instance exited before the
// new one is visible.
//
// A runtime answer is a picture of the moment the runtime made it, which can
// be before a swap the view is applied after (a list forwarded, then the swap,
// then the answer viewed): the answer may lack the new instances the swap
// just made visible. Such an answer is viewed as the pod was when it was
// asked (Pod.preSwap): a view never mixes a runtime picture from before a swap
// with the record from after it.

// verdict is the view's decision on one listed container.
type verdict struct {
	hide bool // not shown (a new instance during a restart, or filtered out)
	fake bool // shown running although it is not
	// running: shown running (really, or fake).
	running bool
	// heldBySwap: shown running in an answer that predates a swap which
	// replaced the instance's container: a relist showing it must hold it
	// (Pod.held), as the swap itself would have.
	heldBySwap bool
}

// instanceView says how the kubelet sees instance id of p in an answer the
// runtime gave to a request made at epoch asked (Manager.epoch).
func instanceView(p *Pod, id string, asked uint64) (hide, fake, before bool) {
	if p.preSwap.epoch > asked {
		_, isNew := p.preSwap.hidden[id]
		return isNew, !isNew && p.preSwap.fake[id], true
	}
	if p.Phase == PhaseRunning {
		return false, false, false
	}
	if _, isNew := p.New[id]; isNew {
		return true, false, false
	}
	return false, p.Fake[id], false
}

// replaced says whether the last swap gave container name a new instance.
func (s swapPicture) replaced(name string) bool {
	for _, n := range s.hidden {
		if n == name {
			return true
		}
	}
	return false
}

// listVerdicts decides, for each listed container, whether the kubelet sees
// it and whether it is shown running although it is not. pod finds a tracked
// pod by sandbox ID (nil: untracked, shown as it is); want is the caller's
// state filter, applied after the view (an exited old instance shown running
// matches a "running" filter). A fake verdict is only given to a container
// that is not running.
func listVerdicts(pod func(sandboxID string) *Pod, vs []cview, want *runtimeapi.ContainerStateValue, asked uint64) []verdict {
	out := make([]verdict, len(vs))
	for i, c := range vs {
		state := c.state
		p := pod(c.sandbox)
		before := false
		if p != nil {
			hide, fake, b := instanceView(p, c.id, asked)
			if hide {
				out[i].hide = true
				continue
			}
			before = b
			if fake && state != runtimeapi.ContainerState_CONTAINER_RUNNING {
				out[i].fake = true
				state = runtimeapi.ContainerState_CONTAINER_RUNNING
			}
		}
		if want != nil && state != want.State {
			out[i].hide = true
			continue
		}
		if state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			out[i].running = true
			out[i].heldBySwap = before && p.preSwap.replaced(c.name)
		}
	}
	return out
}

// statusShownRunning says whether a status of instance id, not running, is
// shown running: an old instance of a restart in progress, or one held since
// a swap until the next relist (Pod.held).
func statusShownRunning(p *Pod, id string, asked uint64, now time.Time) bool {
	if until, ok := p.held[id]; ok && now.Before(until) && !p.Stopped {
		return true
	}
	_, fake, _ := instanceView(p, id, asked)
	return fake
}

// statusMayChange says whether the status path could change anything in
// status v of an instance of p: classify an exit, or show a not-running
// instance as running. A status for which it is false passes as the runtime
// sent it (or is answered from the kept answer, exitedstatus.go).
func statusMayChange(p *Pod, v cview, asked uint64) bool {
	if v.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false // the view only ever shows RUNNING
	}
	if v.state == runtimeapi.ContainerState_CONTAINER_EXITED && (!p.Dead[v.id] || needsClassification(p, v.id, v.name)) {
		return true
	}
	if _, held := p.held[v.id]; held {
		return true
	}
	_, fake, _ := instanceView(p, v.id, asked)
	return fake
}

// needsClassification says whether an exit of instance id (container name)
// of p is still to be classified against the pod's rules.
func needsClassification(p *Pod, id, name string) bool {
	if p.Phase != PhaseRunning || p.Stopped || (len(p.Rules[name]) == 0 && p.Forced[name] == "") || p.Settled[id] ||
		p.Held[name] { // terminated by the orchestrator (hold.go)
		return false
	}
	_, ours := p.IDs[id]
	return ours
}
