package podstate

import "sync/atomic"

// table is the record of every tracked pod and the index from each of its
// container instances to it. m.mu guards it. Which pods and instances exist
// changes only through its methods, which keep the pods, the index of
// instances and the count read without the lock in step.
type table struct {
	pods map[string]*Pod   // by sandbox ID
	byID map[string]string // instance ID -> sandbox ID
	// tracked is len(pods), read without m.mu by the proxy's fast path.
	tracked atomic.Int32
}

func (t *table) init() {
	t.pods, t.byID = map[string]*Pod{}, map[string]string{}
}

// Tracked is the number of pods with rules; zero means every call may be
// forwarded raw.
func (t *table) Tracked() int { return int(t.tracked.Load()) }

// podOf is the pod of instance id, nil when no tracked pod has it.
func (t *table) podOf(id string) *Pod { return t.pods[t.byID[id]] }

// known says whether instance id belongs to a tracked pod.
func (t *table) known(id string) bool {
	_, ok := t.byID[id]
	return ok
}

// put tracks p, a new pod or one read back from its record.
func (t *table) put(p *Pod) {
	if p.IDs == nil {
		p.IDs = map[string]string{}
	}
	if p.Latest == nil {
		p.Latest = map[string]string{}
	}
	if p.Creates == nil {
		p.Creates = map[string][]byte{}
	}
	if p.Phase == "" {
		p.Phase = PhaseRunning
	}
	t.pods[p.SandboxID] = p
	for id := range p.IDs {
		t.byID[id] = p.SandboxID
	}
	t.tracked.Store(int32(len(t.pods)))
}

// drop stops tracking the sandbox's pod and returns it (nil if untracked).
func (t *table) drop(sandboxID string) *Pod {
	p := t.pods[sandboxID]
	if p == nil {
		return nil
	}
	for id := range p.IDs {
		delete(t.byID, id)
	}
	delete(t.pods, sandboxID)
	t.tracked.Store(int32(len(t.pods)))
	return p
}

// addInstance records instance id, of container name, in p.
func (t *table) addInstance(p *Pod, id, name string) {
	p.IDs[id] = name
	t.byID[id] = p.SandboxID
}

// dropInstance forgets instance id of p, in every per-instance part of its
// record.
func (t *table) dropInstance(p *Pod, id string) {
	delete(p.IDs, id)
	delete(p.Old, id)
	delete(p.New, id)
	delete(p.Fake, id)
	delete(p.Settled, id)
	delete(p.Dead, id)
	delete(p.shownRunning, id)
	delete(p.held, id)
	delete(t.byID, id)
}
