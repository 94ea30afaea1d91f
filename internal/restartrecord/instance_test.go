package restartrecord

import (
	"testing"
)

// A snapshot holds copies of the records: a step that changes an instance
// and is rolled back (its save failed) leaves the instance as it was.
func TestSnapshotCopiesEachInstance(t *testing.T) {
	p := &Pod{}
	p.AddInstance("a", "main", PartNone)
	snap := p.Snapshot()
	p.Inst("a").Settled, p.Inst("a").Part = true, PartOld
	p.AddInstance("b", "main", PartNew)
	*p = snap
	if in := p.Inst("a"); in.Settled || in.Part != PartNone || p.Ours("b") {
		t.Fatalf("after the rollback: a %+v, b known %v", in, p.Ours("b"))
	}
}
