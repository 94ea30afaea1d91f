package restartrecord

// The relist's question, asked of every container of a large node's list
// once a second per kubelet: could this ID be one of a tracked pod's
// instances? It is answered from the ID's first 8 bytes as one integer,
// without hashing or comparing the whole ID and without touching a pod.

import "encoding/binary"

// prefix is id's first 8 bytes as an integer, zero-padded when shorter.
// containerd's IDs are 64 random hex digits, so two share one rarely.
func prefix(id []byte) uint64 {
	if len(id) >= 8 {
		return binary.LittleEndian.Uint64(id)
	}
	var b [8]byte
	copy(b[:], id)
	return binary.LittleEndian.Uint64(b[:])
}

// MayHold reports whether a tracked pod may hold instance id: false means
// none does; true means one does, or (rarely) another ID of the records
// begins with the same 8 bytes. A caller that needs certainty asks Of.
func (r *Records) MayHold(id []byte) bool {
	return r.prefixes[prefix(id)] > 0
}

// index makes instance id of sandboxID's pod found by Of and MayHold.
func (r *Records) index(id, sandboxID string) {
	if _, ok := r.byID[id]; !ok {
		r.prefixes[prefix([]byte(id))]++
	}
	r.byID[id] = sandboxID
}

// unindex forgets instance id for Of and MayHold.
func (r *Records) unindex(id string) {
	if _, ok := r.byID[id]; !ok {
		return
	}
	delete(r.byID, id)
	k := prefix([]byte(id))
	if r.prefixes[k]--; r.prefixes[k] == 0 {
		delete(r.prefixes, k)
	}
}
