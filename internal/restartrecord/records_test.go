package restartrecord

import (
	"errors"
	"log/slog"
	"testing"
)

// openRecords are the records of a fresh store under a test directory,
// with one tracked pod (instance "a" of main), and a switch that makes
// every write fail.
func openRecords(t *testing.T) (r *Records, p *Pod, dir string, failing *bool) {
	t.Helper()
	dir = t.TempDir()
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	failing = new(bool)
	write := st.Write
	st.Write = func(path string, b []byte) error {
		if *failing {
			return errors.New("disk full")
		}
		return write(path, b)
	}
	r = NewRecords(st, slog.New(slog.DiscardHandler))
	p = &Pod{SandboxID: sbA, Name: "p", Namespace: "ns"}
	r.Add(p)
	r.AddInstance(p, "a", "main", PartNone)
	if err := r.Save(p); err != nil {
		t.Fatal(err)
	}
	return r, p, dir, failing
}

// A change whose save fails is put back, in memory and in the index: an
// instance it added is not found, one it removed is found again, and the
// disk keeps the record from before.
func TestChangeNotSavedIsPutBack(t *testing.T) {
	r, p, dir, failing := openRecords(t)
	*failing = true
	err := r.Update(p, func(p *Pod) error {
		r.RemoveInstance(p, "a")
		r.AddInstance(p, "b", "main", PartNew)
		p.Restarts = 7
		return nil
	})
	if err == nil {
		t.Fatal("a change whose save failed was committed")
	}
	if r.Of("a") != p || r.Of("b") != nil || !p.Ours("a") || p.Ours("b") || p.Restarts != 0 || r.Indexed() != 1 {
		t.Fatalf("after the rollback: a %v, b %v, restarts %d, %d indexed", r.Of("a") != nil, r.Of("b") != nil, p.Restarts, r.Indexed())
	}
	*failing = false
	if got, _ := loadOne(t, dir); got == nil || got.Restarts != 0 || got.Instances["a"] == nil {
		t.Fatalf("on disk: %+v", got)
	}
}

// A change that fails after a nested change saved part of it is put back
// on disk too; one whose nested change saved it reports Saved.
func TestChangeUndoesANestedSave(t *testing.T) {
	r, p, dir, _ := openRecords(t)
	outer := r.Begin(p)
	p.Restarts = 1
	if err := r.Update(p, func(p *Pod) error { p.Scope = "main"; return nil }); err != nil {
		t.Fatal(err)
	}
	if !outer.Saved() {
		t.Fatal("a nested save is not seen")
	}
	if err := outer.Commit(errors.New("a later step failed")); err == nil {
		t.Fatal("the change's own error was not returned")
	}
	if p.Restarts != 0 || p.Scope != "" {
		t.Fatalf("in memory after the rollback: restarts %d scope %q", p.Restarts, p.Scope)
	}
	if got, _ := loadOne(t, dir); got == nil || got.Restarts != 0 || got.Scope != "" {
		t.Fatalf("on disk after the rollback: %+v", got)
	}
}

// A pod dropped while a step held it is not saved again, and a rollback
// of the step does not index its instances again.
func TestDroppedPodIsNotSaved(t *testing.T) {
	r, p, _, _ := openRecords(t)
	c := r.Begin(p)
	r.AddInstance(p, "b", "main", PartNew)
	if r.Drop(sbA) != p || r.Get(sbA) != nil || r.Len() != 0 {
		t.Fatal("the pod is still tracked")
	}
	if err := c.Commit(nil); !errors.Is(err, ErrRemoved) {
		t.Fatalf("commit of a dropped pod: %v, want ErrRemoved", err)
	}
	if r.Indexed() != 0 {
		t.Fatalf("%d instances of a dropped pod indexed", r.Indexed())
	}
}
