package podstate

import (
	"testing"
)

// A snapshot holds copies of the records: a step that changes an instance
// and is rolled back (its save failed) leaves the instance as it was.
func TestSnapshotCopiesEachInstance(t *testing.T) {
	p := &Pod{}
	p.addInstance("a", "main", PartNone)
	snap := p.snapshot()
	p.inst("a").Settled, p.inst("a").Part = true, PartOld
	p.addInstance("b", "main", PartNew)
	*p = snap
	if in := p.inst("a"); in.Settled || in.Part != PartNone || p.ours("b") {
		t.Fatalf("after the rollback: a %+v, b known %v", in, p.ours("b"))
	}
}
