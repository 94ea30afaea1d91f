package restartrecord

import (
	"strings"

	"github.com/cri-shim/cri-shim/internal/wire"
	"testing"
)

// MayHold is true for every instance Of finds, through each way one enters
// or leaves the records (AddInstance, RemoveInstance, a change put back,
// Drop, Add of a loaded record), and false for IDs none begins like.
// Two IDs with the same first 8 bytes are counted apart: removing one
// leaves the other held.
func TestMayHoldFollowsTheIndex(t *testing.T) {
	r, p, _, failing := openRecords(t)
	id := func(head, tail string) string { return head + strings.Repeat(tail, 64-len(head)) }
	ids := []string{"a", "b", id("11111111", "1"), id("11111111", "2"), id("33333333", "3"), id("44444444", "4")}
	check := func(step string, want ...string) {
		t.Helper()
		for _, x := range ids {
			held := false
			for _, w := range want {
				held = held || w == x || w[:min(8, len(w))] == x[:min(8, len(x))]
			}
			if got := r.MayHold(wire.IDHead([]byte(x))); got != held {
				t.Errorf("%s: MayHold(%.10s…) = %v, want %v (Of finds it: %v)", step, x, got, held, r.Of(x) != nil)
			}
		}
	}
	check("start", "a")
	r.AddInstance(p, ids[2], "main", PartNew)
	r.AddInstance(p, ids[3], "side", PartNew)
	check("added", "a", ids[2], ids[3])
	r.RemoveInstance(p, ids[2])
	check("one of two alike removed", "a", ids[3])
	r.RemoveInstance(p, ids[2])
	check("removed twice", "a", ids[3])
	*failing = true
	if err := r.Update(p, func(p *Pod) error {
		r.RemoveInstance(p, ids[3])
		r.AddInstance(p, ids[4], "main", PartNew)
		return nil
	}); err == nil {
		t.Fatal("a change whose save failed was committed")
	}
	*failing = false
	check("put back", "a", ids[3])
	r.Drop(p.SandboxID)
	check("dropped")
	r.Add(&Pod{SandboxID: "sb-loaded", Instances: map[string]*Instance{ids[5]: {Name: "main"}, "b": {Name: "side"}}})
	check("loaded", ids[5], "b")
}
