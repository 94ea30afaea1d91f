package ckptstore

import (
	"cmp"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// The node-wide cap on pulled checkpoints ([checkpoint]
// pull_max_total_bytes): the oci- directories on disk and the archive bytes
// of the pulls in progress together stay under it. A pull reserves its bytes
// once its images are checked, before an archive byte is fetched
// (ReservePulled); if they do not fit, pulled checkpoints no pod uses are
// removed, oldest first, and if they still do not fit the pull is refused
// with a ResourceExhausted error the kubelet retries.

// pulledEvictAfter is how old a pulled checkpoint no warm start uses must
// be before the cap may remove it: a pull answered Unavailable (pull_wait)
// is picked up by the kubelet's retry, whose back-off reaches 5 minutes.
var pulledEvictAfter = 5 * time.Minute

// pulledEntry is one complete pulled checkpoint under the root.
type pulledEntry struct {
	name  string
	dir   string
	bytes int64
	mtime time.Time
}

// listPulled returns the complete pulled checkpoints under the root (the
// real path) with their sizes. It walks them: never called with s.mu held.
func (s *Store) listPulled() (string, []pulledEntry, error) {
	root, err := filepath.EvalSymlinks(s.cfg.Root)
	if err != nil {
		return "", nil, err
	}
	ents, err := s.pulledNames(root)
	if err != nil {
		return "", nil, err
	}
	for i := range ents {
		ents[i].bytes = sizeDir(ents[i].dir)
	}
	return root, ents, nil
}

// pulledNames lists the pulled checkpoints under root with their times, not
// their sizes (a stat each: cheap under s.mu).
func (s *Store) pulledNames(root string) ([]pulledEntry, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []pulledEntry
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), layout.PulledDirPrefix) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, pulledEntry{name: e.Name(), dir: filepath.Join(root, e.Name()), mtime: fi.ModTime()})
	}
	return out, nil
}

// sizeDir is dirBytes (tests replace it).
var sizeDir = dirBytes

// dirBytes is the size of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// PulledBytes is the size of the pulled checkpoints on disk (the metric
// cri_shim_pulled_checkpoint_bytes).
func (s *Store) PulledBytes() int64 {
	_, ents, _ := s.listPulled()
	var n int64
	for _, e := range ents {
		n += e.bytes
	}
	return n
}

// ReservePulled reserves n archive bytes for a pull about to fetch them
// (internal/ociartifact's PullOptions.Reserve) under [checkpoint]
// pull_max_total_bytes. release gives the reservation back once the pull
// ended, renamed into place or not: its directory is then counted on disk.
// When the pulled checkpoints on disk and the reservations in progress leave
// no room, the pulled checkpoints no warm start or warm restart uses that are
// older than pulledEvictAfter are removed, oldest first, until n fits; if it
// still does not, the error is of errdefs' ResourceExhausted class and
// nothing was reserved.
//
// The directories are sized before s.mu is taken (a walk of each), and the
// removed ones deleted after it is released (renamed away under it), so
// the warm starts and the other calls that take s.mu are not held up by the
// disk. Under s.mu the root is listed again: a directory pulled meanwhile
// (its reservation given back since) is counted, sized then, and the times
// the choice is made by are read again (a pod may have been answered one).
func (s *Store) ReservePulled(n int64) (release func(), err error) {
	max := s.cfg.PullMaxTotalBytes
	var (
		root  string
		sized []pulledEntry
	)
	if max > 0 {
		if root, sized, err = s.listPulled(); err != nil {
			return nil, proxy.Errorf(errdefs.ErrUnavailable, "pulled checkpoints: reading the checkpoint root: %v", err)
		}
	}
	var retired []string
	defer func() { s.deleteRetired(retired...) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	if max > 0 {
		ents, err := s.pulledNames(root)
		if err != nil {
			return nil, proxy.Errorf(errdefs.ErrUnavailable, "pulled checkpoints: reading the checkpoint root: %v", err)
		}
		bytes := map[string]int64{}
		for _, e := range sized {
			bytes[e.name] = e.bytes
		}
		var held int64
		for i, e := range ents {
			b, ok := bytes[e.name]
			if !ok {
				b = sizeDir(e.dir) // pulled since the listing: one walk of a few files
			}
			ents[i].bytes = b
			held += b
		}
		if held+s.pullReserved+n > max {
			held, retired = s.evictPulledLocked(ents, held, max-s.pullReserved-n)
		}
		if held+s.pullReserved+n > max {
			s.pulledRefused.Inc()
			return nil, proxy.Errorf(errdefs.ErrResourceExhausted,
				"this pull needs %d bytes, and pulled checkpoints hold %d bytes on this node with %d more being pulled: over [checkpoint] pull_max_total_bytes %d even with every pulled checkpoint no pod uses removed",
				n, held, s.pullReserved, max)
		}
	}
	s.pullReserved += n
	s.pulledReserved.Set(float64(s.pullReserved))
	done := false
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !done {
			done = true
			s.pullReserved -= n
			s.pulledReserved.Set(float64(s.pullReserved))
		}
	}, nil
}

// evictPulledLocked renames away pulled checkpoints no pod uses, oldest
// first, until held is at most target, and returns what is held then and
// the renamed directories, for deleteRetired once s.mu is released. s.mu
// held.
func (s *Store) evictPulledLocked(ents []pulledEntry, held, target int64) (int64, []string) {
	inUse := map[string]bool{}
	for dir := range s.inUse {
		inUse[filepath.Base(dir)] = true
	}
	for name := range s.pinnedPulled {
		inUse[name] = true
	}
	slices.SortFunc(ents, func(a, b pulledEntry) int { return cmp.Or(a.mtime.Compare(b.mtime), strings.Compare(a.name, b.name)) })
	var retired []string
	for _, e := range ents {
		if held <= target {
			break
		}
		if inUse[e.name] || time.Since(e.mtime) < pulledEvictAfter {
			continue
		}
		if tmp := s.retirePulledLocked(e.dir, "[checkpoint] pull_max_total_bytes: room for a new pull"); tmp != "" {
			held -= e.bytes
			retired = append(retired, tmp)
			s.pulledEvicted.Inc()
		}
	}
	return held, retired
}

// PinPulled keeps the pulled checkpoint name from the cap's eviction while
// a RunPodSandbox starts a pod from it, until its warm-start record is in
// place (or the call failed); the returned func unpins it.
func (s *Store) PinPulled(name string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pinnedPulled[name]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.pinnedPulled[name]--; s.pinnedPulled[name] <= 0 {
			delete(s.pinnedPulled, name)
		}
	}
}
