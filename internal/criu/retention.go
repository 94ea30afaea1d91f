package criu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Stored is a complete checkpoint found under the root.
type Stored struct {
	Name     string
	Dir      string
	Manifest *Manifest
}

// List returns the complete checkpoints directly under root, oldest first.
// Directories without a valid manifest are skipped (problems lists them).
func List(root string) (out []Stored, problems []string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, []string{err.Error()}
	}
	for _, e := range ents {
		// Dot names are the service's working directories (staged
		// restores, pulls in progress), never checkpoints.
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(root, e.Name())
		m, err := ReadManifest(dir)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		out = append(out, Stored{Name: e.Name(), Dir: dir, Manifest: m})
	}
	slices.SortFunc(out, func(a, b Stored) int { return a.Manifest.CheckpointedAt.Compare(b.Manifest.CheckpointedAt) })
	return out, problems
}

// retain applies max_per_pod, max_bytes_per_namespace and max_total_bytes to
// the managed checkpoints,
// oldest first, never removing keep (the one just written) nor a checkpoint a
// warm start or a warm restart is still reading.
func (s *Service) retain(keep string) {
	if s.cfg.MaxPerPod == 0 && s.cfg.MaxTotalBytes == 0 && s.cfg.MaxBytesPerNamespace == 0 {
		return
	}
	all, _ := List(s.cfg.Root)
	s.mu.Lock()
	inUse := s.inUseLocked()
	s.mu.Unlock()
	var managed []Stored
	for _, c := range all {
		if c.Manifest.Managed && !strings.HasPrefix(c.Name, PulledDirPrefix) {
			managed = append(managed, c)
		}
	}
	removed := map[string]bool{}
	remove := func(c Stored, why string) {
		if c.Dir == keep || inUse[c.Dir] || removed[c.Dir] {
			return
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			s.log.Warn("checkpoint: retention could not remove a checkpoint", "path", c.Dir, "err", err)
			return
		}
		removed[c.Dir] = true
		s.metrics.retentionRemove.Inc()
		s.log.Info("checkpoint: retention removed a checkpoint", "path", c.Dir, "pod", c.Manifest.Pod.Namespace+"/"+c.Manifest.Pod.Name,
			"age", time.Since(c.Manifest.CheckpointedAt).Round(time.Second).String(), "why", why)
	}
	if n := s.cfg.MaxPerPod; n > 0 {
		perPod := map[string][]Stored{}
		for _, c := range managed {
			k := c.Manifest.Pod.Namespace + "/" + c.Manifest.Pod.Name
			perPod[k] = append(perPod[k], c)
		}
		for _, cs := range perPod {
			for i := 0; i < len(cs)-n; i++ {
				remove(cs[i], "max_per_pod")
			}
		}
	}
	// trim removes the oldest of cs (oldest first) until the rest fit in max bytes.
	trim := func(cs []Stored, max int64, why string) {
		var total int64
		for _, c := range cs {
			if !removed[c.Dir] {
				total += c.Manifest.SizeBytes
			}
		}
		for _, c := range cs {
			if total <= max {
				return
			}
			if removed[c.Dir] {
				continue
			}
			if remove(c, why); removed[c.Dir] {
				total -= c.Manifest.SizeBytes
			}
		}
	}
	if max := s.cfg.MaxBytesPerNamespace; max > 0 {
		perNS := map[string][]Stored{}
		for _, c := range managed {
			perNS[c.Manifest.Pod.Namespace] = append(perNS[c.Manifest.Pod.Namespace], c)
		}
		for _, cs := range perNS {
			trim(cs, max, "max_bytes_per_namespace")
		}
	}
	if max := s.cfg.MaxTotalBytes; max > 0 {
		trim(managed, max, "max_total_bytes")
	}
}

// inUseLocked are the checkpoint directories a warm start or a warm restart
// is reading, which retention leaves alone. s.mu held.
func (s *Service) inUseLocked() map[string]bool {
	inUse := map[string]bool{}
	for _, w := range s.warm {
		inUse[w.Dir] = true
	}
	for dir := range s.restoring {
		inUse[dir] = true
	}
	return inUse
}
