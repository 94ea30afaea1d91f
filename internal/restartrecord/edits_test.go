package restartrecord

import "testing"

// What the kubelet sees of each instance, from the record alone: during a
// restart the new instances are hidden and the shown old ones run; a hidden
// instance stays hidden in any phase; outside a restart everything is as it is.
func TestView(t *testing.T) {
	p := &Pod{Phase: PhaseStartup}
	addInstance(p, "old", "main", PartOld)
	p.Inst("old").Shown = true
	addInstance(p, "new", "main", PartNew)
	addInstance(p, "gone", "init", PartNone)
	p.Inst("gone").Hidden = true
	cases := []struct {
		phase      Phase
		id         string
		hide, fake bool
	}{
		{PhaseStartup, "old", false, true},
		{PhaseStartup, "new", true, false},
		{PhaseStartup, "gone", true, false},
		{PhaseStartup, "unknown", false, false},
		{PhaseRunning, "old", false, false},
		{PhaseRunning, "new", false, false},
		{PhaseRunning, "gone", true, false},
	}
	for _, c := range cases {
		p.Phase = c.phase
		if hide, fake := p.View(p.Inst(c.id)); hide != c.hide || fake != c.fake {
			t.Errorf("%s in %s: hide %v fake %v, want %v %v", c.id, c.phase, hide, fake, c.hide, c.fake)
		}
	}
}

// A restart replaces the one container of a Restart rule, or every
// container with an old instance; the replayed create in flight is pending
// only in Startup and only for its own container.
func TestReplacesAndPendingCreate(t *testing.T) {
	p := &Pod{Phase: PhaseStartup, Creating: "main/3"}
	addInstance(p, "a", "main", PartOld)
	addInstance(p, "b", "side", PartNone)
	if !p.Replaces("main") || p.Replaces("side") {
		t.Fatal("a pod restart replaces exactly the containers with an old instance")
	}
	p.Scope = "side"
	if p.Replaces("main") || !p.Replaces("side") {
		t.Fatal("a Restart rule replaces exactly its one container")
	}
	if !p.PendingCreate("c", "main") || p.PendingCreate("c", "side") || p.PendingCreate("a", "main") {
		t.Fatal("only an unknown instance of the container being created is pending")
	}
	p.Phase = PhaseTerminating
	if p.PendingCreate("c", "main") {
		t.Fatal("nothing is pending outside Startup")
	}
}

// A container with more instances on record than the kubelet keeps plus
// the slack is a backlog; a Restart rule's restart counts only its container.
func TestBacklogged(t *testing.T) {
	p := &Pod{}
	for i := range 1 + BacklogSlack + 1 {
		addInstance(p, string(rune('a'+i)), "main", PartNone)
	}
	if name, n := p.Backlogged(1); name != "main" || n != 6 {
		t.Fatalf("got %q %d, want main 6", name, n)
	}
	if name, _ := p.Backlogged(2); name != "" {
		t.Fatalf("with a keep of 2, %q has a backlog", name)
	}
	p.Scope = "side"
	if name, _ := p.Backlogged(1); name != "" {
		t.Fatalf("a restart of side counts %q", name)
	}
}
