package restartrecord

// The relist's question, asked of every container of a large node's list
// once a second per kubelet: could this ID be one of a tracked pod's
// instances? It is answered from the ID's first 8 bytes as one integer
// (wire.IDHead), from a set the walk reads without the engine's lock
// (Heads), without hashing or comparing the whole ID and without touching
// a pod.

import (
	"maps"
	"slices"

	"github.com/cri-shim/cri-shim/internal/wire"
)

// prefix is wire.IDHead of a string ID.
func prefix(id string) uint64 { return wire.IDHead([]byte(id)) }

// Heads is the set of the heads (wire.IDHead) of every instance Of finds.
// An ID whose head is not in it is no tracked pod's instance; one whose
// head is in it is, or (rarely) shares its first 8 bytes with one: a
// caller that needs certainty asks Of. The set does not change once
// returned (a change of the index makes a new one), so it may be read
// after the caller's lock is let go.
func (r *Records) Heads() *wire.HeadSet {
	if r.heads == nil {
		r.heads = wire.NewHeadSet(slices.Collect(maps.Keys(r.prefixes)))
	}
	return r.heads
}

// Quiet is the set of the heads of the instances an unfiltered list
// shows as the runtime lists them, and of which it records nothing, when
// it lists them running (podstate's Verdicts): instances of a pod without
// a restart in progress, neither hidden nor held, that a list already
// showed running (Listed). A head two instances share is left out. The set
// does not change once returned, like Heads.
//
// It is made again after anything that can make an instance leave it:
// every save (the phase, Hidden, a hold and Listed cleared are edits of a
// change, which are saved or put back), Add, Drop and every change of the
// index. Edits outside a change may only bring an instance into it (a list
// marks it Listed, a hold ends): the caller then calls Recheck, or it
// stays out until the next save, which is only slower.
func (r *Records) Quiet() *wire.HeadSet {
	r.survey()
	return r.quiet
}

// Restarting are the sandbox IDs of the pods whose restart is in
// progress (not in PhaseRunning), which the caller must not change. A
// phase changes only in a change, so it is made again as Quiet is.
func (r *Records) Restarting() []string {
	r.survey()
	return r.restarting
}

// survey makes Quiet and Restarting again if anything may have changed
// them since they were made.
func (r *Records) survey() {
	if r.surveyed {
		return
	}
	var heads []uint64
	r.restarting = r.restarting[:0:0]
	for sb, p := range r.pods {
		if p.Phase != PhaseRunning {
			r.restarting = append(r.restarting, sb)
			continue
		}
		for id, in := range p.Instances {
			if k := prefix(id); in.Listed && !in.Hidden && !in.Held() && r.prefixes[k] == 1 {
				heads = append(heads, k)
			}
		}
	}
	r.quiet, r.surveyed = wire.NewHeadSet(heads), true
}

// Recheck has Quiet made again: an instance was edited outside a change
// in a way that may bring it into the set (see Quiet).
func (r *Records) Recheck() { r.surveyed = false }

// index makes instance id of sandboxID's pod found by Of and Heads.
func (r *Records) index(id, sandboxID string) {
	if _, ok := r.byID[id]; !ok {
		k := prefix(id)
		if r.prefixes[k]++; r.prefixes[k] == 1 {
			r.heads = nil
		}
		r.surveyed = false
	}
	r.byID[id] = sandboxID
}

// unindex forgets instance id for Of and Heads.
func (r *Records) unindex(id string) {
	if _, ok := r.byID[id]; !ok {
		return
	}
	delete(r.byID, id)
	k := prefix(id)
	if r.prefixes[k]--; r.prefixes[k] == 0 {
		delete(r.prefixes, k)
		r.heads = nil
	}
	r.surveyed = false
}
