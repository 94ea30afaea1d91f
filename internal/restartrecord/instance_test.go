package restartrecord

import "testing"

// addInstance records instance id of container name with part in p, as
// Records.AddInstance does in a tracked pod.
func addInstance(p *Pod, id, name string, part Part) {
	if p.Instances == nil {
		p.Instances = map[string]*Instance{}
	}
	p.Instances[id] = &Instance{Name: name, Part: part}
}

// A snapshot holds copies of the records: a step that changes an instance
// and is rolled back (its save failed) leaves the instance as it was.
func TestSnapshotCopiesEachInstance(t *testing.T) {
	p := &Pod{}
	addInstance(p, "a", "main", PartNone)
	snap := p.Snapshot()
	p.Inst("a").Settled, p.Inst("a").Part = true, PartOld
	addInstance(p, "b", "main", PartNew)
	*p = snap
	if in := p.Inst("a"); in.Settled || in.Part != PartNone || p.Ours("b") {
		t.Fatalf("after the rollback: a %+v, b known %v", in, p.Ours("b"))
	}
}
