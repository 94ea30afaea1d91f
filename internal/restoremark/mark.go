// Package restoremark is the handshake between cri-shim and its containerd
// runtime shim (cmd/containerd-shim-cri-shim-v2, docs/restore-route.md).
//
// cri-shim creates a restored container through the CRI like any other, from
// the new pod's own config, stages the checkpoint's CRIU images and rootfs
// diff in a directory of its own, and leaves a mark named by the container's
// ID. When the kubelet (or crictl) starts the container, containerd asks the
// pod's runtime shim to create the task; the runtime shim claims the mark (a
// rename, so it is used at most once) and creates the task as a restore from
// the staged images. After the start, cri-shim sees the mark claimed, or
// knows the container started without its checkpoint.
//
// Both sides run as root; the runtime shim trusts a mark only when the
// directory and the file are root's and nobody else may write them, and it
// checks every path the mark names the same way.
package restoremark

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultDir is where cri-shim leaves marks and the runtime shim looks for
// them. It is fixed, as the runtime shim is started by containerd with no
// way to be told; it is on /run, so a mark never outlives a reboot. Marks
// are small: the images they name are under cri-shim's checkpoint root.
const DefaultDir = "/run/cri-shim-restore"

// claimedSuffix names a mark the runtime shim has used.
const claimedSuffix = ".claimed"

// maxMarkSize bounds what the runtime shim reads of a mark.
const maxMarkSize = 4096

// Mark is what the runtime shim needs to create a task as a restore.
type Mark struct {
	// Images is the directory of the container's CRIU images.
	Images string `json:"images"`
	// RootfsDiff is a layer tar (gzip or plain, with OCI whiteouts) applied
	// to the container's rootfs before the restore; empty for none.
	RootfsDiff string `json:"rootfsDiff,omitempty"`
	// RootfsDiffMaxBytes is the most the diff may expand to (cri-shim's
	// [checkpoint] pull_max_bytes); 0 or more than MaxRootfsDiffBytes is
	// MaxRootfsDiffBytes (RootfsDiffLimit).
	RootfsDiffMaxBytes int64 `json:"rootfsDiffMaxBytes,omitempty"`
}

// MaxRootfsDiffBytes bounds a rootfs diff's expanded size whatever a mark
// says: the runtime shim has no configuration of its own. It is the default
// of cri-shim's [checkpoint] pull_max_bytes, the largest checkpoint archive
// the node takes, so a plain diff of any archive the node accepts is within
// it; a smaller pull_max_bytes lowers it.
const MaxRootfsDiffBytes = 16 << 30

// RootfsDiffLimit is the bound on a rootfs diff's expanded size for a
// configured or marked bound n: n, or MaxRootfsDiffBytes when n is not
// within (0, MaxRootfsDiffBytes].
func RootfsDiffLimit(n int64) int64 {
	if n <= 0 || n > MaxRootfsDiffBytes {
		return MaxRootfsDiffBytes
	}
	return n
}

// Dir is a directory of marks. Owner is the uid every file and directory
// must belong to (0 in production; the test's uid in unit tests).
type Dir struct {
	Path  string
	Owner int
}

// Default is the directory cri-shim and its runtime shim share.
func Default() Dir { return Dir{Path: DefaultDir, Owner: 0} }

// idRE is a containerd object ID (containerd's identifiers.Validate, which
// the CRI's 64-hex IDs satisfy).
var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,75}$`)

func checkID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("container ID %q is not a containerd identifier", id)
	}
	return nil
}

// Write leaves the mark for container id, replacing none: an existing mark
// is an error. It is written whole under a temporary name, synced, and
// renamed into place, so the runtime shim never reads half of one.
func (d Dir) Write(id string, m Mark) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := m.check(d.Owner); err != nil {
		return err
	}
	if err := os.Mkdir(d.Path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("restore marks: %w", err)
	}
	if err := d.checkDir(); err != nil {
		return err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := filepath.Join(d.Path, "."+id+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("restore mark: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// link+unlink rather than rename: it fails when a mark is there.
		err = os.Link(tmp, d.mark(id))
	}
	_ = os.Remove(tmp)
	if err != nil {
		return fmt.Errorf("restore mark of %s: %w", id, err)
	}
	return nil
}

func (d Dir) mark(id string) string    { return filepath.Join(d.Path, id) }
func (d Dir) claimed(id string) string { return filepath.Join(d.Path, id+claimedSuffix) }

// Claim takes the mark of container id for its task's creation: nil when
// there is none. A mark that is there but cannot be trusted or read is an
// error, so that a container meant to be restored never starts fresh.
func (d Dir) Claim(id string) (*Mark, error) {
	if err := checkID(id); err != nil {
		return nil, nil // not a container cri-shim marks
	}
	if _, err := os.Lstat(d.Path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err := d.checkDir(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(d.mark(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore mark of %s: %w", id, err)
	}
	defer f.Close()
	if err := checkOwned(f, d.Owner, false); err != nil {
		return nil, fmt.Errorf("restore mark of %s: %w", id, err)
	}
	m, err := decode(io.LimitReader(f, maxMarkSize+1))
	if err != nil {
		return nil, fmt.Errorf("restore mark of %s: %w", id, err)
	}
	if err := m.check(d.Owner); err != nil {
		return nil, fmt.Errorf("restore mark of %s: %w", id, err)
	}
	if err := os.Rename(d.mark(id), d.claimed(id)); err != nil {
		return nil, fmt.Errorf("restore mark of %s: claiming it: %w", id, err)
	}
	return m, nil
}

// Claimed reports whether the runtime shim claimed container id's mark.
func (d Dir) Claimed(id string) bool {
	if checkID(id) != nil {
		return false
	}
	_, err := os.Lstat(d.claimed(id))
	return err == nil
}

// Remove removes container id's mark, claimed or not.
func (d Dir) Remove(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	var errs []error
	for _, p := range []string{d.mark(id), d.claimed(id), d.refused(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Entry is a mark found in the directory.
type Entry struct {
	ID      string
	Claimed bool
	Mark    *Mark // nil when it could not be read
}

// List returns the marks in the directory (for cri-shim's recovery).
func (d Dir) List() ([]Entry, error) {
	ents, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range ents {
		name := e.Name()
		id, claimed := name, false
		if strings.HasSuffix(name, refusedSuffix) {
			continue // read with its mark (Refused)
		}
		if base, ok := strings.CutSuffix(name, claimedSuffix); ok {
			id, claimed = base, true
		}
		if checkID(id) != nil || !e.Type().IsRegular() {
			continue
		}
		en := Entry{ID: id, Claimed: claimed}
		if b, err := os.ReadFile(filepath.Join(d.Path, name)); err == nil && len(b) <= maxMarkSize {
			if m, err := decode(bytes.NewReader(b)); err == nil {
				en.Mark = m
			}
		}
		out = append(out, en)
	}
	return out, nil
}

func decode(r io.Reader) (*Mark, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if len(b) > maxMarkSize {
		return nil, fmt.Errorf("larger than %d bytes", maxMarkSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Mark
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decoding: trailing data")
	}
	return &m, nil
}

// check refuses a mark whose paths are not absolute and clean, or are not
// owner's (a directory of images, a regular file for the diff), or whose
// diff bound is negative.
func (m *Mark) check(owner int) error {
	if err := checkPath(m.Images, owner, true); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	if m.RootfsDiff != "" {
		if err := checkPath(m.RootfsDiff, owner, false); err != nil {
			return fmt.Errorf("rootfs diff: %w", err)
		}
	}
	if m.RootfsDiffMaxBytes < 0 {
		return fmt.Errorf("rootfs diff bound %d is negative", m.RootfsDiffMaxBytes)
	}
	return nil
}

func checkPath(p string, owner int, dir bool) error {
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%q is not an absolute, clean path", p)
	}
	flags := os.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if dir {
		flags |= unix.O_DIRECTORY
	}
	f, err := os.OpenFile(p, flags, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return checkOwned(f, owner, dir)
}

// checkOwned refuses a file not of the wanted kind, not owner's, or that
// others may write.
func checkOwned(f *os.File, owner int, dir bool) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if dir != fi.IsDir() || !dir && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s", f.Name(), fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != owner {
		return fmt.Errorf("%s is not owned by uid %d", f.Name(), owner)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s may be written by others (%v)", f.Name(), fi.Mode().Perm())
	}
	return nil
}

// checkDir refuses a mark directory that is a symlink, not owner's, or
// writable by others.
func (d Dir) checkDir() error {
	f, err := os.OpenFile(d.Path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("restore marks %s: %w", d.Path, err)
	}
	defer f.Close()
	if err := checkOwned(f, d.Owner, true); err != nil {
		return fmt.Errorf("restore marks: %w", err)
	}
	return nil
}
