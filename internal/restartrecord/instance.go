package restartrecord

// One record per container instance: everything the restart knows of an
// instance, in one place, so a restart step changes one record instead of
// keeping several sets in step.

import "time"

// Part is an instance's part in the pod's restart in progress.
type Part string

const (
	// PartNone: not part of a restart in progress.
	PartNone Part = ""
	// PartOld: an instance from before the restart, which the restart
	// stops (if it still runs) and replaces.
	PartOld Part = "old"
	// PartNew: an instance the restart created, hidden from the kubelet
	// until the swap.
	PartNew Part = "new"
)

// Instance is one container instance of a tracked pod.
type Instance struct {
	// Name is the container's name in the pod.
	Name string `json:"name"`
	// Part is its part in the restart in progress; cleared at the swap.
	Part Part `json:"part,omitempty"`
	// Shown: an old instance shown running to the kubelet until the swap
	// (the trigger, and the instances that ran when the rule matched).
	Shown bool `json:"shown,omitempty"`
	// Settled: its exit is handled (no rule matched, or an earlier restart
	// dealt with it); the kubelet sees it as it is.
	Settled bool `json:"settled,omitempty"`
	// Dead: seen exited; it is not shown running during a restart.
	Dead bool `json:"dead,omitempty"`
	// StopAsked: when the kubelet's first stop of it reached the shim
	// (the host's clock, as containerd's exit times). An exit after it is
	// the kubelet's decision, which no rule restarts; one before it is the
	// container's own. Recorded before the stop acts, so a restarted shim
	// tells the two apart as well.
	StopAsked time.Time `json:"stopAsked,omitzero"`
	// HeldUntil: a swap replaced it after a list showed it running; until
	// then (at the latest) it is shown running, in ContainerStatus and in
	// lists without a state filter, while the kubelet's reads of the pod
	// may belong to a list from before the swap (podstate's heldLocked). The kubelet
	// reads a pod as one list and then, seconds later under load, the
	// status of each container that list showed (kuberuntime_container.go
	// getPodContainerStatuses): a swap in between would show it the old
	// instance exited and not the new one, a terminated container that
	// then "becomes" running, which its status manager refuses ("attempted
	// illegal transition"), failing a restartPolicy Never pod. Recorded
	// with the swap, so a shim restarted in between keeps the same picture.
	HeldUntil time.Time `json:"heldUntil,omitzero"`
	// Hidden: an old instance of a container that a restart handed back to
	// the kubelet did not start again (an init container failed before it):
	// kept from the kubelet's lists until the kubelet creates the container
	// itself, or a later swap replaces it. Upstream removes these instances
	// (SyncPod's ContainersToReset); a visible one of a regular container,
	// even exited, makes a kubelet v1.37 take the pod for initialized
	// (computeInitContainerActions, HasAnyActiveRegularContainerStarted) and
	// start it without the failed init container, and a visible exited
	// sidecar makes any kubelet restart the sidecar instead of the init
	// container before it. Recorded with the swap.
	Hidden bool `json:"hidden,omitempty"`

	// Listed: some list (any caller, any filter) showed it running; the
	// swap that replaces it holds it if so. In memory only.
	Listed bool `json:"-"`
	// HeldAt is the pod's read count when its hold began; a hold loaded
	// from disk has 0 and counts from this process's start.
	HeldAt uint64 `json:"-"`
	// Starting: the kubelet's StartContainer of it is in the runtime. A
	// restart that begins meanwhile shows it running and stops it only
	// once the start has returned (podstate's race.go). In memory only:
	// a restarted shim has no call in flight.
	Starting bool `json:"-"`
}

// Held reports whether the instance has a hold, over or not.
func (in *Instance) Held() bool { return !in.HeldUntil.IsZero() }

// EndHold drops the instance's hold.
func (in *Instance) EndHold() { in.HeldUntil, in.HeldAt = time.Time{}, 0 }

// Inst is the record of instance id, nil when the pod has none.
func (p *Pod) Inst(id string) *Instance { return p.Instances[id] }

// Ours reports whether id is an instance of the pod.
func (p *Pod) Ours(id string) bool { return p.Instances[id] != nil }

// PartOf returns the IDs of the instances with part, by ID -> name.
func (p *Pod) PartOf(part Part) map[string]string {
	out := map[string]string{}
	for id, in := range p.Instances {
		if in.Part == part {
			out[id] = in.Name
		}
	}
	return out
}

// NewOf is the instance the restart in progress created for container
// name, "" when none.
func (p *Pod) NewOf(name string) string {
	for id, in := range p.Instances {
		if in.Part == PartNew && in.Name == name {
			return id
		}
	}
	return ""
}

// ShownIDs are the old instances shown running until the swap.
func (p *Pod) ShownIDs() []string {
	var out []string
	for id, in := range p.Instances {
		if in.Shown {
			out = append(out, id)
		}
	}
	return out
}

// EndRestartParts ends every instance's part in a restart: at the swap and
// when a restart is abandoned.
func (p *Pod) EndRestartParts() {
	for _, in := range p.Instances {
		in.Part, in.Shown = PartNone, false
	}
}

// cloneInstances is a deep copy of the records, for a snapshot.
func cloneInstances(in map[string]*Instance) map[string]*Instance {
	if in == nil {
		return nil
	}
	out := make(map[string]*Instance, len(in))
	for id, r := range in {
		c := *r
		out[id] = &c
	}
	return out
}
