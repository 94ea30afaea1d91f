package ckptstore

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// stored writes a checkpoint of namespace ns of size GiB into root, taken
// age before now; managed: scheduled.
func stored(t *testing.T, root, name, ns string, gib int64, managed bool, age time.Duration) string {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m := &layout.Manifest{FormatVersion: layout.Version, Pod: layout.PodInfo{Name: "p-" + name, Namespace: ns, UID: "u-" + name}, Managed: managed,
		CheckpointedAt: time.Now().Add(-age), SizeBytes: gib << 30,
		Containers: []layout.ContainerEntry{{Name: "main", Archive: layout.ArchiveName("main")}}}
	if err := layout.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir
}

func storedNames(t *testing.T, root string) []string {
	t.Helper()
	l, _ := List(root)
	var out []string
	for _, c := range l {
		out = append(out, c.Name)
	}
	slices.Sort(out)
	return out
}

// Issue 28 item 3: one namespace's checkpoints never push out another's.
// Over the node's total, the scheduled checkpoints of the namespace furthest
// over its share go first, however new they are; PodCheckpoint data counts
// in its namespace's share, and one beyond the share fails.
func TestRetentionSharesBetweenNamespaces(t *testing.T) {
	fx := newFixture(t)
	root := fx.root
	os.RemoveAll(fx.dir) // the fixture's own checkpoint
	fx.store.cfg.MaxPerPod, fx.store.cfg.MaxTotalBytes, fx.store.cfg.MaxBytesPerNamespace = 0, 10<<30, 5<<30

	stored(t, root, "b-old", "b", 2, true, 3*time.Hour) // the oldest on the node, another namespace's
	stored(t, root, "a-1", "a", 2, true, 2*time.Hour)
	stored(t, root, "a-2", "a", 2, true, time.Hour)
	stored(t, root, "pcp-a", "a", 2, false, 30*time.Minute) // an object's data: counted, never removed
	keep := stored(t, root, "a-3", "a", 2, true, 0)
	// a: 8 GiB (share 5), b: 2 GiB, node 10 GiB.
	if err := fx.store.Retain(keep, "a"); err != nil {
		t.Fatal(err)
	}
	if got, want := storedNames(t, root), []string{"a-3", "b-old", "pcp-a"}; !slices.Equal(got, want) {
		t.Fatalf("after retention: %v, want %v (a's oldest scheduled ones removed until a is layout.Within its share; b's kept)", got, want)
	}

	// Over the node's total only: the namespace furthest over its share
	// loses its oldest scheduled checkpoint, not the oldest on the node.
	fx.store.cfg.MaxBytesPerNamespace = 0
	fx.store.cfg.MaxTotalBytes = 7 << 30
	stored(t, root, "c-1", "c", 1, true, 4*time.Hour)
	keep = stored(t, root, "a-4", "a", 2, true, 0)
	// a: 6 GiB, b: 2, c: 1; node 9 GiB > 7: a (largest) loses a-3.
	if err := fx.store.Retain(keep, "a"); err != nil {
		t.Fatal(err)
	}
	if got, want := storedNames(t, root), []string{"a-4", "b-old", "c-1", "pcp-a"}; !slices.Equal(got, want) {
		t.Fatalf("after max_total_bytes: %v, want %v", got, want)
	}

	// An object's data beyond its namespace's share fails, and is not
	// made room for at another namespace's expense.
	fx.store.cfg.MaxBytesPerNamespace, fx.store.cfg.MaxTotalBytes = 5<<30, 20<<30
	keep = stored(t, root, "pcp-a2", "a", 4, false, 0) // a: 2 + 2 + 4 of objects and scheduled
	err := fx.store.Retain(keep, "a")
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("want ResourceExhausted for a PodCheckpoint beyond its namespace's share, got %v", err)
	}
	if got := storedNames(t, root); !slices.Contains(got, "b-old") || !slices.Contains(got, "c-1") {
		t.Fatalf("other namespaces' checkpoints were removed: %v", got)
	}
}
