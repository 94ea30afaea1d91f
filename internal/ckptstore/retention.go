package ckptstore

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// Stored is a complete checkpoint found under the root.
type Stored struct {
	Name     string
	Dir      string
	Manifest *layout.Manifest
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
		m, err := layout.ReadManifest(dir)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		out = append(out, Stored{Name: e.Name(), Dir: dir, Manifest: m})
	}
	slices.SortFunc(out, func(a, b Stored) int { return a.Manifest.CheckpointedAt.Compare(b.Manifest.CheckpointedAt) })
	return out, problems
}

// Retain applies max_per_pod, max_bytes_per_namespace and max_total_bytes
// after keep (the checkpoint just written, in namespace ns) was written.
//
// Every checkpoint under the root counts: scheduled ones, PodCheckpoint
// objects' data (pcp-*) and named ones; pulled checkpoints (oci-*) have
// their own cap (pulledcap.go). Only scheduled (managed) checkpoints are
// removed, oldest first, never keep nor one a warm start or a warm restart
// is reading: first those of a namespace over its share, then, while the
// node is over its total, those of the namespace furthest over its share,
// so that one namespace's checkpoints never push out another's. When keep
// is an object's data and its namespace or the node is still over its bound,
// the error says so (ResourceExhausted); the caller removes keep.
func (s *Store) Retain(keep, ns string) error {
	all, _ := List(s.cfg.Root)
	inUse := s.inUseNow()
	var counted []Stored
	used := map[string]int64{} // bytes by namespace
	var total int64
	for _, c := range all {
		if strings.HasPrefix(c.Name, layout.PulledDirPrefix) {
			continue
		}
		counted = append(counted, c)
		used[c.Manifest.Pod.Namespace] += c.Manifest.SizeBytes
		total += c.Manifest.SizeBytes
	}
	removed := map[string]bool{}
	removable := func(c Stored) bool {
		return c.Manifest.Managed && c.Dir != keep && inUse[c.Dir] == 0 && !removed[c.Dir]
	}
	remove := func(c Stored, why string) {
		if !removable(c) {
			return
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			s.log.Warn("checkpoint: retention could not remove a checkpoint", "path", c.Dir, "err", err)
			return
		}
		removed[c.Dir] = true
		used[c.Manifest.Pod.Namespace] -= c.Manifest.SizeBytes
		total -= c.Manifest.SizeBytes
		s.retentionRemove.Inc()
		s.log.Info("checkpoint: retention removed a checkpoint", "path", c.Dir, "pod", c.Manifest.Pod.Namespace+"/"+c.Manifest.Pod.Name,
			"age", time.Since(c.Manifest.CheckpointedAt).Round(time.Second).String(), "why", why)
	}
	if n := s.cfg.MaxPerPod; n > 0 {
		perPod := map[string][]Stored{}
		for _, c := range counted {
			if c.Manifest.Managed {
				k := c.Manifest.Pod.Namespace + "/" + c.Manifest.Pod.Name
				perPod[k] = append(perPod[k], c)
			}
		}
		for _, cs := range perPod {
			for i := 0; i < len(cs)-n; i++ {
				remove(cs[i], "max_per_pod")
			}
		}
	}
	share := s.cfg.MaxBytesPerNamespace
	if share > 0 {
		for _, c := range counted { // oldest first
			if used[c.Manifest.Pod.Namespace] > share {
				remove(c, "max_bytes_per_namespace")
			}
		}
	}
	if max := s.cfg.MaxTotalBytes; max > 0 {
		for total > max {
			// The namespace furthest over its share (or the largest,
			// without shares) that still has a removable checkpoint.
			victim, found := Stored{}, false
			var worst int64
			for _, c := range counted {
				if !removable(c) {
					continue
				}
				over := used[c.Manifest.Pod.Namespace] - share
				if !found || over > worst {
					victim, worst, found = c, over, true
				}
			}
			if !found {
				break
			}
			remove(victim, "max_total_bytes")
			if !removed[victim.Dir] {
				break // could not be removed: do not loop on it
			}
		}
	}
	if !strings.HasPrefix(filepath.Base(keep), layout.ObjectDirPrefix) {
		return nil
	}
	if share > 0 && used[ns] > share {
		return fmt.Errorf("%w: namespace %s holds %d bytes of checkpoints, more than its share of %d (checkpoint.max_bytes_per_namespace); delete some of its PodCheckpoints",
			errdefs.ErrResourceExhausted, ns, used[ns], share)
	}
	if max := s.cfg.MaxTotalBytes; max > 0 && total > max {
		return fmt.Errorf("%w: the node holds %d bytes of checkpoints, more than checkpoint.max_total_bytes (%d)", errdefs.ErrResourceExhausted, total, max)
	}
	return nil
}
