package restartrecord

// Edits and readings of one record that need nothing but the record. The
// caller (podstate) holds its lock, and saves the record (Change) before
// acting on an edit.

import (
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// MarkDead records that instance id was seen exited.
func (p *Pod) MarkDead(id string) {
	if in := p.Inst(id); in != nil {
		in.Dead = true
	}
}

// Settle records that instance id's exit is handled.
func (p *Pod) Settle(id string) {
	if in := p.Inst(id); in != nil {
		in.Settled = true
	}
}

// NeedsClassification reports whether the exit of instance id (of
// container name) is still to be classified against the rules: the pod is
// Running, the container has a rule or a forced action, and the exit is
// neither handled nor left alone for the orchestrator (Held).
func (p *Pod) NeedsClassification(id, name string) bool {
	in := p.Inst(id)
	return in != nil && p.Phase == PhaseRunning && !p.Stopped && (len(p.Rules[name]) > 0 || p.Forced[name] != "") &&
		!in.Settled && !p.Held[name]
}

// Forgettable reports whether instance id, gone from the runtime, may
// leave the record: not while a restart in progress still refers to it
// (its trigger, the instances it stops or shows, the ones it created), nor
// while it is its container's newest.
func (p *Pod) Forgettable(id string) bool {
	in := p.Inst(id)
	if in == nil {
		return false
	}
	restarting := p.Phase != PhaseRunning
	switch {
	case p.Latest[in.Name] == id || in.Shown || in.Part == PartNew:
		return false
	case restarting && p.Trigger != nil && p.Trigger.ContainerID == id:
		return false
	}
	return !(in.Part == PartOld && restarting && !in.Dead) // else still to be stopped by the restart
}

// Force has container name's next exit classified with action instead of
// the rules (a command of the pod's orchestrator).
func (p *Pod) Force(name, action string) {
	if p.Forced == nil {
		p.Forced = map[string]string{}
	}
	p.Forced[name] = action
}

// SetHeld holds (hold true) or releases a container the orchestrator
// terminated: its exits are left alone until it restarts the container.
func (p *Pod) SetHeld(container string, hold bool) {
	if !hold {
		delete(p.Held, container)
		return
	}
	if p.Held == nil {
		p.Held = map[string]bool{}
	}
	p.Held[container] = true
}

// BacklogSlack is how many instances of a container beyond the kubelet's
// keep a restart tolerates: the one it replaces and three more. A kubelet
// falling behind piles up hundreds (bench/results/backoff-stress-20261124-184953-stopped.txt).
const BacklogSlack = 4

// Backlogged returns a container the restart in progress creates again that
// has more than keep+BacklogSlack instances on record (every instance the
// runtime still has: removals are forgotten), and how many; "" when none has.
func (p *Pod) Backlogged(keep int) (string, int) {
	counts := map[string]int{}
	for _, in := range p.Instances {
		if p.Scope == "" || in.Name == p.Scope {
			counts[in.Name]++
		}
	}
	for name, n := range counts {
		if n > keep+BacklogSlack {
			return name, n
		}
	}
	return "", 0
}

// View says how the kubelet sees one instance of the pod, from the record
// alone: during a restart, the instances that were running (and the
// trigger) still run, and the new instances do not exist yet. A hold
// (podstate's heldLocked) may show a replaced instance running after the
// swap too, and an instance a handed-back restart left behind stays hidden
// (Instance.Hidden). in is the instance (Inst), nil when not the pod's.
func (p *Pod) View(in *Instance) (hide, fakeRunning bool) {
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

// ResumeShown marks, in a loaded record, what the kubelet may have seen:
// the instances a restart in progress shows running. The previous process's
// lists may have shown them, so a swap before the kubelet's next read keeps
// them shown (a hold), as it would have in that process.
func (p *Pod) ResumeShown() {
	if p.Phase == PhaseRunning {
		return
	}
	for _, in := range p.Instances {
		if in.Shown {
			in.Listed = true
		}
	}
}

// PendingCreate reports whether a listed instance (id, of container name)
// the record does not know is the replayed create in flight (Creating): the
// runtime has it, the record does not yet, and until it does it is hidden
// like the rest of PartNew.
func (p *Pod) PendingCreate(id, name string) bool {
	if p.Phase != PhaseStartup || p.Creating == "" || p.Ours(id) {
		return false
	}
	creating, _, _ := strings.Cut(p.Creating, "/")
	return creating == name
}

// Replaces reports whether the restart in progress creates the next
// instance of container name: the one container of a Restart rule, or any
// container with an instance from before a pod restart.
func (p *Pod) Replaces(name string) bool {
	if p.Scope != "" {
		return p.Scope == name
	}
	for _, in := range p.Instances {
		if in.Part == PartOld && in.Name == name {
			return true
		}
	}
	return false
}

// Refusal is the error of a kubelet's create of container name that the
// restart in progress creates itself (Replaces).
func (p *Pod) Refusal(name string) error {
	wait := ""
	if d := time.Until(p.NotBefore); d > 0 {
		wait = ", next instance in " + d.Round(100*time.Millisecond).String()
	}
	return fmt.Errorf("cri-shim: container %q of pod %s/%s is being restarted by its restart rule (%s%s); "+
		"another instance is not created beside it: %w", name, p.Namespace, p.Name, p.Phase, wait, errdefs.ErrUnavailable)
}
