package podstate

import "testing"

func TestTableIndexesEveryInstanceOfAPod(t *testing.T) {
	var tb table
	tb.init()
	tb.put(&Pod{SandboxID: "sb", IDs: map[string]string{"a": "main"}})
	p := tb.pods["sb"]
	tb.addInstance(p, "b", "main")
	if tb.Tracked() != 1 || tb.podOf("a") != p || tb.podOf("b") != p || !tb.known("b") {
		t.Fatalf("tracked %d, a -> %v, b -> %v", tb.Tracked(), tb.podOf("a"), tb.podOf("b"))
	}
	if tb.drop("sb") != p || tb.Tracked() != 0 || tb.known("a") || tb.known("b") {
		t.Fatalf("after drop: tracked %d, index %v", tb.Tracked(), tb.byID)
	}
}

func TestDroppedInstanceLeavesNoTrace(t *testing.T) {
	var tb table
	tb.init()
	tb.put(&Pod{SandboxID: "sb"})
	p := tb.pods["sb"]
	tb.addInstance(p, "a", "main")
	p.Old, p.New, p.Fake = map[string]string{"a": "main"}, map[string]string{"a": "main"}, map[string]bool{"a": true}
	p.Settled, p.Dead, p.shownRunning = map[string]bool{"a": true}, map[string]bool{"a": true}, map[string]bool{"a": true}
	tb.dropInstance(p, "a")
	if tb.known("a") || len(p.IDs)+len(p.Old)+len(p.New)+len(p.Fake)+len(p.Settled)+len(p.Dead)+len(p.shownRunning) != 0 {
		t.Fatalf("instance left behind: %+v", p)
	}
}
