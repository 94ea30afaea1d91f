package criu

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pulledUnusedFor is how long a pulled checkpoint no warm start uses is kept
// (a pod refused after the pull, or gone before the kubelet's retry).
var pulledUnusedFor = 30 * time.Minute

// pulledTempFor is how old the temporary directory of a pull must be before
// the sweep takes it for the leftover of a shim killed mid-pull (longer than
// [checkpoint] pull_timeout may be).
var pulledTempFor = 6 * time.Hour

// pulledTempPrefix begins the temporary directory of a pull for a restore
// (internal/ociartifact writes ".pull-<name>-*").
const pulledTempPrefix = ".pull-" + PulledDirPrefix

// Pulled checkpoints (PulledDirPrefix) are a cache of registry content for
// the pods that name it, outside retention (max_per_pod, max_total_bytes)
// and bounded together by pull_max_total_bytes (pulledcap.go):
// one is removed when the last warm start using it ends (its sandbox is
// removed: releasePulled), and one no warm start uses is removed by the
// sweep once it is pulledUnusedFor old (sweepPulled). A later pod naming
// the same reference pulls it again.

// releasePulled removes the pulled checkpoint dir once no warm start uses it.
func (s *Service) releasePulled(dir string) {
	if !strings.HasPrefix(filepath.Base(dir), PulledDirPrefix) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.warm {
		if w.Dir == dir {
			return
		}
	}
	s.removePulled(dir, "its last warm-started pod is gone")
}

// sweepPulled removes the pulled checkpoints no warm start uses that are
// older than pulledUnusedFor, and pulls' temporary directories older than
// pulledTempFor.
func (s *Service) sweepPulled() {
	ents, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		return
	}
	root, err := filepath.EvalSymlinks(s.cfg.Root)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	inUse := map[string]bool{}
	for _, w := range s.warm {
		inUse[w.Dir] = true
	}
	for name := range s.pinnedPulled {
		inUse[filepath.Join(root, name)] = true
	}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		age := pulledUnusedFor
		why := "no pod used it"
		if strings.HasPrefix(e.Name(), pulledTempPrefix) {
			age, why = pulledTempFor, "left by a pull that did not finish"
		} else if !strings.HasPrefix(e.Name(), PulledDirPrefix) || inUse[dir] {
			continue
		}
		if fi, err := e.Info(); !e.IsDir() || err != nil || time.Since(fi.ModTime()) < age {
			continue
		}
		s.removePulled(dir, why)
	}
}

// removePulled removes a pulled checkpoint and reports whether it is gone;
// s.mu is held, so no warm start begins using it meanwhile.
func (s *Service) removePulled(dir, why string) bool {
	if err := os.RemoveAll(dir); err != nil {
		s.log.Warn("checkpoint: removing a pulled checkpoint", "path", dir, "err", err)
		return false
	}
	s.log.Info("checkpoint: removed a pulled checkpoint", "path", dir, "why", why)
	return true
}
