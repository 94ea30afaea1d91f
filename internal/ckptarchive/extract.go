package ckptarchive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// MaxEntries bounds the entries a restore reads of one archive.
const MaxEntries = 100000

// Files is what a restore takes of a container's archive.
type Files struct {
	Images  string // the CRIU images directory
	Diff    string // the rootfs changes (a layer tar); "" for none
	LogOff  int64  // container.log's data in the archive
	LogSize int64  // -1: the archive has no log
}

// Extract copies the CRIU images (checkpoint/) and the rootfs changes
// (rootfs-diff.tar) of a container archive into dir, and finds its log.
// The archive is untrusted: only regular files are taken, the images
// directory is flat, no name repeats, and every other entry is skipped
// unread.
func Extract(archive, dir string) (Files, error) {
	out := Files{Images: filepath.Join(dir, "checkpoint"), LogSize: -1}
	if err := os.Mkdir(out.Images, 0o700); err != nil {
		return out, err
	}
	f, err := os.Open(archive)
	if err != nil {
		return out, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var seen layout.MemberNames
	images := 0
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("reading: %w", err)
		}
		if n >= MaxEntries {
			return out, fmt.Errorf("more than %d entries", MaxEntries)
		}
		if len(hdr.Name) > layout.MaxMemberName {
			return out, fmt.Errorf("entry %q: a name of %d bytes, more than %d", truncate(hdr.Name, 64), len(hdr.Name), layout.MaxMemberName)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "checkpoint" && hdr.Typeflag == tar.TypeDir {
			continue
		}
		img, isImage := strings.CutPrefix(name, "checkpoint/")
		var dst string
		switch {
		case isImage:
			if strings.Contains(img, "/") || img == "" || img == "." || img == ".." {
				return out, fmt.Errorf("entry %q: the CRIU images directory is flat", truncate(hdr.Name, 64))
			}
			dst = filepath.Join(out.Images, img)
		case name == "rootfs-diff.tar":
			dst = filepath.Join(dir, name)
		case name == "container.log":
		default:
			continue // config.dump, spec.dump, status.dump, ...: never read
		}
		if err := seen.Add(name); err != nil {
			return out, err
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Size < 0 || sparse(hdr) {
			return out, fmt.Errorf("entry %q is not a regular file", truncate(name, 64))
		}
		// The header is read; the file's offset is the entry's data
		// (tar.Reader reads nothing ahead, and skips data with Seek).
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return out, err
		}
		if name == "container.log" {
			out.LogOff, out.LogSize = off, hdr.Size
			continue
		}
		if err := copyOut(dst, f, off, hdr.Size); err != nil {
			return out, fmt.Errorf("entry %q: %w", truncate(name, 64), err)
		}
		if isImage {
			images++
		} else {
			out.Diff = dst
		}
	}
	if images == 0 {
		return out, errors.New("no CRIU images (checkpoint/)")
	}
	return out, nil
}

// sparse reports whether a tar entry is stored sparse: its data is then not
// one contiguous range of the archive.
func sparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// copyOut copies n bytes of src from off into a new file dst (0600), in the
// kernel where it can: the archive is not written any more, so a file system
// with reflinks may share the blocks.
func copyOut(dst string, src *os.File, off, n int64) (err error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return kernelCopy(f, 0, src, off, n)
}

// CopyLog writes the checkpoint's log into the restored container's new log
// file, which the runtime creates only when it starts the container (and
// then appends to): the restored container's log begins with its output up
// to the checkpoint.
func CopyLog(archive string, off, n int64, logPath string) error {
	src, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	return copyOutMode(logPath, src, off, n, 0o640)
}

func copyOutMode(dst string, src *os.File, off, n int64, mode os.FileMode) error {
	if err := copyOut(dst, src, off, n); err != nil {
		if !errors.Is(err, os.ErrExist) { // the file is ours: the copy made it
			_ = os.Remove(dst)
		}
		return err
	}
	return os.Chmod(dst, mode)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
