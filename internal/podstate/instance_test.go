package podstate

import (
	"encoding/json"
	"testing"
	"time"
)

// A record written by a version that kept instances as one set per fact
// (ids, old, fake, new, settled, dead, keepShown) is read into one record
// per instance, so a shim upgraded in the middle of a restart carries it on.
func TestRecordOfTheSetsVersionIsReadPerInstance(t *testing.T) {
	until := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	old := `{"sandboxId":"sb","phase":"Startup","creates":{},"latest":{"main":"n1"},
		"ids":{"o1":"main","o2":"side","n1":"main","x":"init"},
		"old":{"o1":"main","o2":"side"},"fake":{"o1":true,"o2":true},"new":{"n1":"main"},
		"settled":{"o1":true,"x":true},"dead":{"o1":true,"x":true},"keepShown":{"x":"` + until.Format(time.RFC3339) + `"}}`
	var p Pod
	if err := json.Unmarshal([]byte(old), &p); err != nil {
		t.Fatal(err)
	}
	want := map[string]Instance{
		"o1": {Name: "main", Part: PartOld, Shown: true, Settled: true, Dead: true},
		"o2": {Name: "side", Part: PartOld, Shown: true},
		"n1": {Name: "main", Part: PartNew},
		"x":  {Name: "init", Settled: true, Dead: true, HeldUntil: until},
	}
	if len(p.Instances) != len(want) {
		t.Fatalf("instances %v", p.Instances)
	}
	for id, w := range want {
		if got := p.Instances[id]; got == nil || !got.HeldUntil.Equal(w.HeldUntil) || got.Name != w.Name || got.Part != w.Part ||
			got.Shown != w.Shown || got.Settled != w.Settled || got.Dead != w.Dead {
			t.Errorf("%s = %+v, want %+v", id, got, w)
		}
	}
	// Written again, it is this version's record, read back the same.
	b, _ := json.Marshal(&p)
	var again Pod
	if err := json.Unmarshal(b, &again); err != nil {
		t.Fatal(err)
	}
	if len(again.Instances) != 4 || *again.Instances["o1"] != *p.Instances["o1"] || again.Phase != PhaseStartup {
		t.Fatalf("round trip: %s", b)
	}
}

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
