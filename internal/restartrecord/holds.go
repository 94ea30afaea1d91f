package restartrecord

// The relist's question, asked of every container of a large node's list
// once a second per kubelet: could this ID be one of a tracked pod's
// instances? It is answered from the ID's first 8 bytes as one integer
// (wire.IDHead), without hashing or comparing the whole ID and without
// touching a pod.

import "github.com/cri-shim/cri-shim/internal/wire"

// prefix is wire.IDHead of a string ID.
func prefix(id string) uint64 { return wire.IDHead([]byte(id)) }

// MayHold reports whether a tracked pod may hold an instance whose ID's
// head (wire.IDHead) is head: false means none does; true means one does,
// or (rarely) another ID of the records begins with the same 8 bytes. A
// caller that needs certainty asks Of.
func (r *Records) MayHold(head uint64) bool {
	return r.prefixes[head] > 0
}

// index makes instance id of sandboxID's pod found by Of and MayHold.
func (r *Records) index(id, sandboxID string) {
	if _, ok := r.byID[id]; !ok {
		r.prefixes[prefix(id)]++
	}
	r.byID[id] = sandboxID
}

// unindex forgets instance id for Of and MayHold.
func (r *Records) unindex(id string) {
	if _, ok := r.byID[id]; !ok {
		return
	}
	delete(r.byID, id)
	k := prefix(id)
	if r.prefixes[k]--; r.prefixes[k] == 0 {
		delete(r.prefixes, k)
	}
}
