package ckptstore

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
)

const testDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// A pulled checkpoint no pod uses is swept once old, and a pull's temporary
// directory once much older (a shim killed mid-pull); a fresh one, one in
// use, a pull that may still run and a user's checkpoint are not.
func TestUnusedPulledCheckpointsAreSwept(t *testing.T) {
	fx := newFixture(t)
	old := time.Now().Add(-2 * pulledUnusedFor)
	mk := func(name string, mtime time.Time) string {
		d := filepath.Join(fx.root, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(d, mtime, mtime)
		return d
	}
	stale := mk(layout.PulledDir(testDigest), old)
	fresh := mk(layout.PulledDir(strings.Repeat("1", 64)), time.Now())
	used := mk(layout.PulledDir(strings.Repeat("2", 64)), old)
	user := mk("mine", old)
	tmpOld := mk(pulledTempPrefix+testDigest+"-1", time.Now().Add(-2*pulledTempFor))
	tmpNew := mk(pulledTempPrefix+testDigest+"-2", old)
	fx.store.mu.Lock()
	fx.store.inUse[used] = 1
	fx.store.mu.Unlock()
	fx.store.sweepPulled()
	for d, want := range map[string]bool{stale: false, fresh: true, used: true, user: true, tmpOld: false, tmpNew: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists=%v after the sweep, want %v", filepath.Base(d), err == nil, want)
		}
	}
}

// A removal that dies midway (a shim killed, or a file written into the
// directory as it was deleted) never leaves a half-removed directory under
// the oci- name, which a later pod would take for pulled: the directory is
// renamed away first, and the next sweep finishes the deletion.
func TestPulledRemovalRenamesFirst(t *testing.T) {
	fx := newFixture(t)
	root, _ := filepath.EvalSymlinks(fx.root)
	d := mkPulled(t, root, digestName('a'), 100, time.Now())
	os.WriteFile(filepath.Join(d, layout.ManifestFile), []byte("{}"), 0o600)
	removeAll = func(p string) error {
		os.Remove(filepath.Join(p, layout.ManifestFile)) // part of the way, then killed
		return fmt.Errorf("killed")
	}
	t.Cleanup(func() { removeAll = os.RemoveAll })
	fx.store.ReleasePulled(d)
	if _, err := os.Lstat(d); !os.IsNotExist(err) {
		t.Fatalf("half-removed pulled checkpoint left under its name: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(root, layout.PulledRemovingPrefix+"*"))
	if len(left) != 1 {
		t.Fatalf("renamed-away directories %v, want one", left)
	}
	removeAll = os.RemoveAll
	fx.store.sweepPulled()
	if _, err := os.Lstat(left[0]); !os.IsNotExist(err) {
		t.Errorf("the sweep left %s: %v", filepath.Base(left[0]), err)
	}
	fx.store.mu.Lock()
	defer fx.store.mu.Unlock()
	if len(fx.store.removing) != 0 {
		t.Errorf("deletions still noted in progress: %v", fx.store.removing)
	}
}

// The temporary directories of pulls a killed shim left, and deletions it
// left half done, are removed at start whatever their age (pulls run only in
// the shim; their bytes would escape the cap); the temporary directory of a
// pull of this shim is not, by the sweep nor by the clean-up of interrupted
// checkpoints.
func TestLeftoverPullsRemovedAtStart(t *testing.T) {
	var leftTemp, leftRemoving string
	fx := newFixtureWith(t, func(rt *ckpttest.Runtime, cfg *Config, ccfg *capture.Config) capture.Tasks {
		os.MkdirAll(cfg.Root, 0o700)
		leftTemp = mkPulled(t, cfg.Root, pulledTempPrefix+testDigest+"-1", 100, time.Now())
		os.WriteFile(filepath.Join(leftTemp, layout.IncompleteFile), nil, 0o600)
		leftRemoving = mkPulled(t, cfg.Root, layout.PulledRemovingPrefix+layout.PulledDir(testDigest)+"-1", 100, time.Now())
		return rt
	})
	if _, err := os.Lstat(leftTemp); !os.IsNotExist(err) {
		t.Errorf("a killed pull's temporary directory is still there after start: %v", err)
	}
	mine := mkPulled(t, fx.root, pulledTempPrefix+testDigest+"-2", 100, time.Now())
	os.WriteFile(filepath.Join(mine, layout.IncompleteFile), nil, 0o600)
	fx.store.sweepPulled()
	fx.cap.CleanIncomplete(nil)
	ents, _ := os.ReadDir(fx.root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 2 || !slices.Contains(names, filepath.Base(mine)) || !slices.Contains(names, "cp1") {
		t.Errorf("under the root after the first sweep: %v, want cp1 and this shim's pull only", names)
	}
	if _, err := os.Stat(filepath.Join(mine, "containers", "app.tar")); err != nil {
		t.Errorf("this shim's pull was emptied: %v", err)
	}
	if _, err := os.Lstat(leftRemoving); !os.IsNotExist(err) {
		t.Errorf("a deletion a killed shim left is still there: %v", err)
	}
}
