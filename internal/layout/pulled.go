package layout

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// Pulled checkpoints: the directories a restore from an image reference
// pulls into (PulledDirPrefix), how one is read, and how one is removed.
// The pull (internal/ociartifact) writes them and the node's checkpoint
// store (internal/ckptstore) keeps and removes them; both follow these rules.

// PulledDir is the directory name of the image index with sha256 hex digest hex.
func PulledDir(hex string) string { return PulledDirPrefix + hex }

// PulledRemovingPrefix begins the name a pulled checkpoint, or a pull's
// temporary directory, is renamed to before it is deleted. The rename is
// atomic: the oci- name is gone at once, so a later pod pulls it again and
// nothing is written into a directory being deleted; a deletion a killed
// shim left half done is finished by the next sweep.
const PulledRemovingPrefix = ".removing-"

// ErrPulledIncomplete is a directory under a pulled checkpoint's name that is
// not a complete checkpoint (ReadPulled): what a removal interrupted by an
// older shim's kill left, or a file there.
var ErrPulledIncomplete = errors.New("not a complete pulled checkpoint")

// ReadPulled reads the pulled checkpoint dir: its manifest, once every
// archive it names is in place. Its error wraps fs.ErrNotExist when there is
// no such directory, ErrPulledIncomplete when what is there is no complete
// checkpoint (to be removed, RemoveIncompletePulled, and pulled again), and
// is anything else when it could not tell (an I/O error).
func ReadPulled(dir string) (*Manifest, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w: not a directory (%s)", dir, ErrPulledIncomplete, fi.Mode().Type())
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, pulledErr(dir, err)
	}
	for _, c := range m.Containers {
		p, err := ArchivePath(dir, c)
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

// RetirePulled renames dir to a new PulledRemovingPrefix name beside it and
// returns that name; "" when dir does not exist.
func RetirePulled(dir string) (string, error) {
	var b [8]byte
	rand.Read(b[:])
	parent := filepath.Dir(dir)
	tmp := filepath.Join(parent, PulledRemovingPrefix+filepath.Base(dir)+"-"+hex.EncodeToString(b[:]))
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

// removeRetired deletes a directory RetirePulled renamed; a second try takes
// a file a write that raced the rename created in it meanwhile.
func removeRetired(tmp string) error {
	err := os.RemoveAll(tmp)
	if err != nil {
		err = os.RemoveAll(tmp)
	}
	return err
}

// RemoveIncompletePulled removes dir, a pulled checkpoint's directory that
// ReadPulled found incomplete, the way the shim removes pulled checkpoints:
// renamed away, then deleted. One that turns out complete once renamed (pulled
// again after another removal, between ReadPulled and the rename) is put back.
// It reports whether something was removed.
func RemoveIncompletePulled(dir string) (bool, error) {
	tmp, err := RetirePulled(dir)
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
