package ckptstore

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// pulledUnusedFor is how long a pulled checkpoint no warm start uses is kept
// (a pod refused after the pull, or gone before the kubelet's retry).
var pulledUnusedFor = 30 * time.Minute

// pulledTempFor is how old the temporary directory of a pull must be before
// a sweep after start-up takes it for a leftover (longer than [checkpoint]
// pull_timeout may be). Those a killed shim left are removed at start
// (retireLeftoverPulls), whatever their age.
var pulledTempFor = 6 * time.Hour

// pulledTempPrefix begins the temporary directory of a pull for a restore
// (internal/ociartifact writes ".pull-<name>-*").
const pulledTempPrefix = ".pull-" + layout.PulledDirPrefix

// removeAll deletes a directory renamed away for removal (tests replace it).
var removeAll = os.RemoveAll

// Pulled checkpoints (layout.PulledDirPrefix) are a cache of registry content for
// the pods that name it, outside retention (max_per_pod, max_total_bytes)
// and bounded together by pull_max_total_bytes (pulledcap.go):
// one is removed when the last warm start using it ends (its sandbox is
// removed: ReleasePulled), and one no warm start uses is removed by the
// sweep once it is pulledUnusedFor old (SweepPulled). A later pod naming
// the same reference pulls it again. Every removal renames the directory
// away (retirePulledLocked, under s.mu) and deletes it after s.mu is
// released (deleteRetired).

// removeRetired deletes a directory layout.RetirePulled renamed; a second try takes
// a file a write that raced the rename created in it meanwhile.
func removeRetired(tmp string) error {
	err := removeAll(tmp)
	if err != nil {
		err = removeAll(tmp)
	}
	return err
}

// ReleasePulled removes the pulled checkpoint dir once no restore uses it
// (Use): its warm start ended or refused it.
func (s *Store) ReleasePulled(dir string) {
	if !strings.HasPrefix(filepath.Base(dir), layout.PulledDirPrefix) {
		return
	}
	s.mu.Lock()
	if s.inUse[dir] > 0 {
		s.mu.Unlock()
		return
	}
	tmp := s.retirePulledLocked(dir, "no warm-started pod reads it any more")
	s.mu.Unlock()
	s.deleteRetired(tmp)
}

// retireLeftoverPulls renames away, at start before any pull can begin, the
// temporary directories of pulls a killed shim left: pulls run only inside
// the shim, and their bytes would escape the node-wide cap (listPulled
// counts oci- directories only). The first sweep deletes them.
func (s *Store) retireLeftoverPulls() {
	ents, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), pulledTempPrefix) {
			continue
		}
		dir := filepath.Join(s.cfg.Root, e.Name())
		if _, err := layout.RetirePulled(dir); err != nil {
			s.log.Warn("checkpoint: removing the temporary directory of a pull a stopped shim left", "path", dir, "err", err)
			continue
		}
		s.log.Info("checkpoint: removing the temporary directory of a pull a stopped shim left", "path", dir)
	}
}

// pulledSweepEvery is how often SweepPulled runs.
var pulledSweepEvery = 5 * time.Minute

// SweepPulled removes, at start and then every pulledSweepEvery, the pulled
// checkpoints no warm start uses any more (sweepPulled). It returns when
// ctx ends.
func (s *Store) SweepPulled(ctx context.Context) {
	for {
		s.sweepPulled()
		if !backoff.Sleep(ctx, pulledSweepEvery) {
			return
		}
	}
}

// sweepPulled removes the pulled checkpoints no warm start uses that are
// older than pulledUnusedFor, pulls' temporary directories older than
// pulledTempFor, and the deletions a killed shim (or a failed one) left
// half done.
func (s *Store) sweepPulled() {
	ents, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		return
	}
	root, err := filepath.EvalSymlinks(s.cfg.Root)
	if err != nil {
		return
	}
	var del []string
	s.mu.Lock()
	inUse := maps.Clone(s.inUse)
	for name := range s.pinnedPulled {
		inUse[filepath.Join(root, name)]++
	}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		age := pulledUnusedFor
		why := "no pod used it"
		switch {
		case strings.HasPrefix(e.Name(), layout.PulledRemovingPrefix):
			if e.IsDir() && !s.removing[dir] {
				s.removing[dir] = true
				del = append(del, dir)
			}
			continue
		case strings.HasPrefix(e.Name(), pulledTempPrefix):
			age, why = pulledTempFor, "left by a pull that did not finish"
		case !strings.HasPrefix(e.Name(), layout.PulledDirPrefix) || inUse[dir] > 0:
			continue
		}
		// Stat again under s.mu: a pull may have answered it to a pod
		// since the listing (restorepull.go touches it).
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < age {
			continue
		}
		if tmp := s.retirePulledLocked(dir, why); tmp != "" {
			del = append(del, tmp)
		}
	}
	s.mu.Unlock()
	s.deleteRetired(del...)
}

// retirePulledLocked renames the pulled checkpoint (or pull's temporary
// directory) dir away for deleteRetired, and returns its new path; "" when
// it is gone already or could not be renamed (logged). s.mu held, so no warm
// start begins using it meanwhile.
func (s *Store) retirePulledLocked(dir, why string) string {
	tmp, err := layout.RetirePulled(dir)
	if err != nil {
		s.log.Warn("checkpoint: removing a pulled checkpoint", "path", dir, "err", err)
		return ""
	}
	if tmp == "" {
		return ""
	}
	s.removing[tmp] = true
	s.log.Info("checkpoint: removed a pulled checkpoint", "path", dir, "why", why)
	return tmp
}

// deleteRetired deletes directories retirePulledLocked renamed, without s.mu
// (a multi-GB deletion does not hold up the service); one that fails is
// taken by the next sweep.
func (s *Store) deleteRetired(tmps ...string) {
	for _, tmp := range tmps {
		if tmp == "" {
			continue
		}
		err := removeRetired(tmp)
		s.mu.Lock()
		delete(s.removing, tmp)
		s.mu.Unlock()
		if err != nil {
			s.log.Warn("checkpoint: deleting a removed pulled checkpoint's files; the sweep tries again", "path", tmp, "err", err)
		}
	}
}
