package restartrecord

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/wire"
)

// Heads holds every instance Of finds, through each way one enters or
// leaves the records (AddInstance, RemoveInstance, a change put back,
// Drop, Add of a loaded record), and no ID none begins like. Two IDs with
// the same first 8 bytes are counted apart: removing one leaves the other
// held. A set once returned does not change: the walk reads it unlocked.
func TestHeadsFollowTheIndex(t *testing.T) {
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
			if got := r.Heads().Has(wire.IDHead([]byte(x))); got != held {
				t.Errorf("%s: Heads().Has(%.10s…) = %v, want %v (Of finds it: %v)", step, x, got, held, r.Of(x) != nil)
			}
		}
	}
	check("start", "a")
	r.AddInstance(p, ids[2], "main", PartNew)
	r.AddInstance(p, ids[3], "side", PartNew)
	check("added", "a", ids[2], ids[3])
	added := r.Heads()
	r.RemoveInstance(p, ids[2])
	r.RemoveInstance(p, ids[3])
	if !added.Has(wire.IDHead([]byte(ids[3]))) || added.Len() != 2 {
		t.Fatalf("a set returned earlier changed with the index: %d heads", added.Len())
	}
	r.AddInstance(p, ids[3], "side", PartNew)
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

// Quiet holds an instance only while a list would show it as it is and
// record nothing of it: listed, neither hidden nor held, its pod without a
// restart in progress, its head its own. Each edit that takes it out is
// seen without a call (a save, an index change); Recheck brings it back
// after edits outside a change. Restarting follows the phases.
func TestQuietFollowsTheRecord(t *testing.T) {
	r, p, _, failing := openRecords(t)
	quiet := func() bool { return r.Quiet().Has(wire.IDHead([]byte("a"))) }
	edit := func(step string, f func(in *Instance), want bool) {
		t.Helper()
		if err := r.Update(p, func(p *Pod) error { f(p.Instances["a"]); return nil }); err != nil {
			t.Fatal(err)
		}
		if quiet() != want {
			t.Fatalf("%s: quiet %v, want %v", step, quiet(), want)
		}
	}
	if quiet() {
		t.Fatal("an instance no list showed is quiet")
	}
	p.Instances["a"].Listed = true
	if quiet() {
		t.Fatal("Quiet was made again without Recheck") // the set in use is kept
	}
	r.Recheck()
	if !quiet() {
		t.Fatal("a listed instance is not quiet after Recheck")
	}
	before := r.Quiet()
	edit("listed cleared", func(in *Instance) { in.Listed = false }, false)
	if !before.Has(wire.IDHead([]byte("a"))) {
		t.Fatal("a set returned earlier changed")
	}
	edit("listed again", func(in *Instance) { in.Listed = true }, true)
	edit("hidden", func(in *Instance) { in.Hidden = true }, false)
	edit("shown", func(in *Instance) { in.Hidden = false }, true)
	edit("held", func(in *Instance) { in.HeldUntil = time.Now().Add(time.Minute) }, false)
	p.Instances["a"].EndHold()
	r.Recheck()
	if !quiet() {
		t.Fatal("an instance whose hold ended is not quiet after Recheck")
	}
	if err := r.Update(p, func(p *Pod) error { return p.Enter(EventMatched, time.Now()) }); err != nil {
		t.Fatal(err)
	}
	if quiet() || !slices.Equal(r.Restarting(), []string{p.SandboxID}) {
		t.Fatalf("restarting pod: quiet %v, restarting %v", quiet(), r.Restarting())
	}
	// A change put back brings the instance back.
	*failing = true
	if err := r.Update(p, func(p *Pod) error { return p.Enter(EventAbandoned, time.Now()) }); err == nil {
		t.Fatal("a change whose save failed was committed")
	}
	*failing = false
	if quiet() || len(r.Restarting()) != 1 {
		t.Fatalf("put back: quiet %v, restarting %v", quiet(), r.Restarting())
	}
	if err := r.Update(p, func(p *Pod) error { return p.Enter(EventAbandoned, time.Now()) }); err != nil {
		t.Fatal(err)
	}
	if !quiet() || len(r.Restarting()) != 0 {
		t.Fatalf("running again: quiet %v, restarting %v", quiet(), r.Restarting())
	}
	// Another instance with a's head: neither is quiet.
	r.AddInstance(p, "a-other", "side", PartNone)
	p.Instances["a-other"].Listed = true
	r.Recheck()
	if wire.IDHead([]byte("a-other")) == wire.IDHead([]byte("a")) {
		t.Fatal("the test's IDs must differ in their first 8 bytes")
	}
	r.AddInstance(p, "a\x00\x00\x00\x00\x00\x00\x00-twin", "side", PartNone)
	if quiet() {
		t.Fatal("a head two instances share is quiet")
	}
	r.Drop(p.SandboxID)
	if quiet() || r.Quiet().Len() != 0 {
		t.Fatal("a dropped pod's instance is quiet")
	}
}
