package criu

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
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
const pulledTempPrefix = ".pull-" + PulledDirPrefix

// pulledRemovingPrefix begins the name a pulled checkpoint, or a pull's
// temporary directory, is renamed to before it is deleted. The rename is
// atomic: the oci- name is gone at once, so a later pod pulls it again and
// nothing is written into a directory being deleted; a deletion a killed
// shim left half done is finished by the next sweep.
const pulledRemovingPrefix = ".removing-"

// ErrPulledIncomplete is a directory under a pulled checkpoint's name that is
// not a complete checkpoint (ReadPulled): what a removal interrupted by an
// older shim's kill left, or a file there.
var ErrPulledIncomplete = errors.New("not a complete pulled checkpoint")

// removeAll deletes a directory renamed away for removal (tests replace it).
var removeAll = os.RemoveAll

// Pulled checkpoints (PulledDirPrefix) are a cache of registry content for
// the pods that name it, outside retention (max_per_pod, max_total_bytes)
// and bounded together by pull_max_total_bytes (pulledcap.go):
// one is removed when the last warm start using it ends (its sandbox is
// removed: releasePulled), and one no warm start uses is removed by the
// sweep once it is pulledUnusedFor old (sweepPulled). A later pod naming
// the same reference pulls it again. Every removal renames the directory
// away (retirePulledLocked, under s.mu) and deletes it after s.mu is
// released (deleteRetired).

// ReadPulled reads the pulled checkpoint dir: its manifest, once every
// archive it names is in place. Its error wraps fs.ErrNotExist when there is
// no such directory, ErrPulledIncomplete when what is there is no complete
// checkpoint (to be removed, RemoveIncompletePulled, and pulled again), and
// is anything else when it could not tell (an I/O error).
func ReadPulled(dir string) (*layout.Manifest, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w: not a directory (%s)", dir, ErrPulledIncomplete, fi.Mode().Type())
	}
	m, err := layout.ReadManifest(dir)
	if err != nil {
		return nil, pulledErr(dir, err)
	}
	for _, c := range m.Containers {
		p, err := layout.ArchivePath(dir, c)
		if err != nil {
			return nil, pulledErr(dir, fmt.Errorf("container %s: %w", c.Name, err))
		}
		if c.SizeBytes != 0 {
			if fi, err := os.Stat(p); err != nil {
				return nil, pulledErr(dir, err)
			} else if fi.Size() != c.SizeBytes {
				return nil, fmt.Errorf("%s: %w: container %s: archive of %d bytes, manifest says %d", dir, ErrPulledIncomplete, c.Name, fi.Size(), c.SizeBytes)
			}
		}
	}
	return m, nil
}

// pulledErr classifies an error reading a pulled checkpoint: a file system
// error other than a missing file is an I/O error (it could not tell);
// anything else (a missing manifest or archive, one that does not parse or
// validate) makes the directory incomplete.
func pulledErr(dir string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ELOOP) && !errors.Is(err, syscall.ENOTDIR) {
		return err
	}
	return fmt.Errorf("%s: %w: %v", dir, ErrPulledIncomplete, err)
}

// retirePulled renames dir to a new pulledRemovingPrefix name beside it and
// returns that name; "" when dir does not exist.
func retirePulled(dir string) (string, error) {
	var b [8]byte
	rand.Read(b[:])
	parent := filepath.Dir(dir)
	tmp := filepath.Join(parent, pulledRemovingPrefix+filepath.Base(dir)+"-"+hex.EncodeToString(b[:]))
	if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, tmp, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", nil
		}
		return "", &os.LinkError{Op: "rename", Old: dir, New: tmp, Err: err}
	}
	// A power loss must not bring the old name back over a half-deleted
	// directory.
	statefile.SyncDir(parent)
	return tmp, nil
}

// removeRetired deletes a directory retirePulled renamed; a second try takes
// a file a write that raced the rename created in it meanwhile.
func removeRetired(tmp string) error {
	err := removeAll(tmp)
	if err != nil {
		err = removeAll(tmp)
	}
	return err
}

// RemoveIncompletePulled removes dir, a pulled checkpoint's directory that
// ReadPulled found incomplete, the way the shim removes pulled checkpoints:
// renamed away, then deleted. One that turns out complete once renamed (pulled
// again after another removal, between ReadPulled and the rename) is put back.
// It reports whether something was removed.
func RemoveIncompletePulled(dir string) (bool, error) {
	tmp, err := retirePulled(dir)
	if err != nil || tmp == "" {
		return false, err
	}
	if _, err := ReadPulled(tmp); err == nil {
		if unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE) == nil {
			return false, nil
		}
	}
	return true, removeRetired(tmp)
}

// releasePulled removes the pulled checkpoint dir once no warm start uses it.
func (s *Service) releasePulled(dir string) {
	if !strings.HasPrefix(filepath.Base(dir), PulledDirPrefix) {
		return
	}
	s.mu.Lock()
	for _, w := range s.warm {
		if w.holds() == dir {
			s.mu.Unlock()
			return
		}
	}
	tmp := s.retirePulledLocked(dir, "no warm-started pod reads it any more")
	s.mu.Unlock()
	s.deleteRetired(tmp)
}

// retireLeftoverPulls renames away, at start before any pull can begin, the
// temporary directories of pulls a killed shim left: pulls run only inside
// the shim, and their bytes would escape the node-wide cap (listPulled
// counts oci- directories only). The first sweep deletes them.
func (s *Service) retireLeftoverPulls() {
	ents, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), pulledTempPrefix) {
			continue
		}
		dir := filepath.Join(s.cfg.Root, e.Name())
		if _, err := retirePulled(dir); err != nil {
			s.log.Warn("checkpoint: removing the temporary directory of a pull a stopped shim left", "path", dir, "err", err)
			continue
		}
		s.log.Info("checkpoint: removing the temporary directory of a pull a stopped shim left", "path", dir)
	}
}

// sweepPulled removes the pulled checkpoints no warm start uses that are
// older than pulledUnusedFor, pulls' temporary directories older than
// pulledTempFor, and the deletions a killed shim (or a failed one) left
// half done.
func (s *Service) sweepPulled() {
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
	inUse := map[string]bool{}
	for _, w := range s.warm {
		inUse[w.holds()] = true
	}
	for name := range s.pinnedPulled {
		inUse[filepath.Join(root, name)] = true
	}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		age := pulledUnusedFor
		why := "no pod used it"
		switch {
		case strings.HasPrefix(e.Name(), pulledRemovingPrefix):
			if e.IsDir() && !s.removing[dir] {
				s.markRemovingLocked(dir)
				del = append(del, dir)
			}
			continue
		case strings.HasPrefix(e.Name(), pulledTempPrefix):
			age, why = pulledTempFor, "left by a pull that did not finish"
		case !strings.HasPrefix(e.Name(), PulledDirPrefix) || inUse[dir]:
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
func (s *Service) retirePulledLocked(dir, why string) string {
	tmp, err := retirePulled(dir)
	if err != nil {
		s.log.Warn("checkpoint: removing a pulled checkpoint", "path", dir, "err", err)
		return ""
	}
	if tmp == "" {
		return ""
	}
	s.markRemovingLocked(tmp)
	s.log.Info("checkpoint: removed a pulled checkpoint", "path", dir, "why", why)
	return tmp
}

func (s *Service) markRemovingLocked(tmp string) {
	if s.removing == nil {
		s.removing = map[string]bool{}
	}
	s.removing[tmp] = true
}

// deleteRetired deletes directories retirePulledLocked renamed, without s.mu
// (a multi-GB deletion does not hold up the service); one that fails is
// taken by the next sweep.
func (s *Service) deleteRetired(tmps ...string) {
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
