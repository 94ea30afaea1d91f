package podcheckpoint

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Issue 28 item 3: the data of an object that is gone (its finalizer
// removed by a user, then deleted) is removed by the sweep; the data of an
// object the node holds, or the reconciler knows, and a directory younger
// than the grace are kept, as is everything that is not an object's.
func TestSweepRemovesOrphanedObjectData(t *testing.T) {
	e := newEnv(t)
	w := &Watches{r: e.r, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	obj := func(uid string) *cpv1.PodCheckpoint {
		return &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n-" + uid, UID: types.UID(uid)}}
	}
	now := time.Now()
	mk := func(name string, age time.Duration) {
		d := filepath.Join(e.root, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "manifest.json"), []byte("{}"), 0o600)
		os.Chtimes(d, now.Add(-age), now.Add(-age))
	}
	mk("pcp-held", time.Hour)
	mk("pcp-known", time.Hour)
	mk("pcp-gone", time.Hour)
	mk("pcp-new", time.Second)
	mk("named-checkpoint", time.Hour)
	mk("oci-abc", time.Hour)
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	store.Add(obj("held"))
	e.r.Observe(obj("known"))

	if n := w.sweepOnce(store, now); n != 1 {
		t.Fatalf("removed %d directories, want 1", n)
	}
	ents, _ := os.ReadDir(e.root)
	var left []string
	for _, d := range ents {
		left = append(left, d.Name())
	}
	want := []string{"named-checkpoint", "oci-abc", "pcp-held", "pcp-known", "pcp-new"}
	if !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
	// Past the grace, the new one's object still unknown: removed too.
	if n := w.sweepOnce(store, now.Add(sweepGrace+time.Second)); n != 1 {
		t.Fatalf("second sweep removed %d, want 1 (pcp-new)", n)
	}
}

// An object the node held that is deleted (a user removed the finalizer):
// its data is removed at once, though the reconciler may not have heard of
// the deletion yet; an object re-created under that name (another UID)
// keeps its own data.
func TestDeletedObjectDataRemovedAtOnce(t *testing.T) {
	e := newEnv(t)
	w := &Watches{r: e.r, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	gone := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone", UID: types.UID("u1")}}
	kept := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kept", UID: types.UID("u2")}}
	for _, pc := range []*cpv1.PodCheckpoint{gone, kept} {
		if err := os.Mkdir(filepath.Join(e.root, DataDir(pc)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e.r.Observe(gone) // the reconciler's copy, not forgotten yet
	w.removeData(gone)
	recreated := kept.DeepCopy()
	recreated.Name = "gone" // same name as the deleted one, its own UID
	e.r.Observe(recreated)
	w.removeData(gone)
	if _, err := os.Stat(filepath.Join(e.root, DataDir(gone))); !os.IsNotExist(err) {
		t.Fatalf("the deleted object's data is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.root, DataDir(kept))); err != nil {
		t.Fatalf("the data of the re-created object was removed: %v", err)
	}
	if e.r.Lookup("ns", "gone") == nil || e.r.Lookup("ns", "gone").UID != "u2" {
		t.Fatal("the re-created object was forgotten")
	}
}
