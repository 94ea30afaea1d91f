// Package server runs the shim daemon: the CRI socket, the proxy, the HTTP
// endpoint for metrics and health, and an orderly shutdown.
package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenUnix listens on a unix socket at path with the given mode and group
// (gid < 0 keeps the default). The directory is created if missing. A leftover
// socket is replaced only when nothing answers on it: a second shim must never
// steal the socket of one that is serving.
//
// The socket never exists at path with another mode or group, not even for a
// moment: bind(2) creates it with the process umask's mode, which a chmod
// after Listen would only narrow once any local user could already have
// connected to a root-owned CRI endpoint. So it is bound in a fresh private
// directory (0700, beside path: same file system) where nobody else can reach
// it, given its mode and group there, and then renamed to path (the bound
// inode keeps its listener; RENAME_NOREPLACE so a socket another process put
// there meanwhile is never replaced). Setting the umask around bind was the
// other way; it is process-wide in Go, so it would race with every other
// goroutine creating files at that moment (state records, checkpoints).
func ListenUnix(path string, mode os.FileMode, gid int) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: create directory: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: exists and is not a socket; refusing to replace it", path)
		}
		c, derr := net.DialTimeout("unix", path, time.Second)
		if derr == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another process is serving on this socket", path)
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) && !errors.Is(derr, syscall.ENOENT) {
			return nil, fmt.Errorf("listen %s: cannot tell whether the existing socket is in use: %w", path, derr)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	removeStalePrivateDirs(dir)
	private, err := os.MkdirTemp(dir, privatePrefix+"*") // 0700
	if err != nil {
		return nil, fmt.Errorf("listen %s: private directory: %w", path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// The listener would unlink its bind name on Close; the socket lives at
	// path, which unixListener removes instead.
	l.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Errorf("chmod %o: %w", mode, err))
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("chown to gid %d: %w", gid, err))
		}
	}
	err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) {
		// A file system without RENAME_NOREPLACE: a hard link never
		// replaces either; the private name goes with the directory.
		err = os.Link(tmp, path)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fail(errors.New("another process created the socket meanwhile; refusing to replace it"))
		}
		return fail(fmt.Errorf("move into place: %w", err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: l, path: path, fi: fi}, nil
}

const privatePrefix = ".cri-shim-listen-"

// removeStalePrivateDirs removes the private directories of earlier starts
// that died between creating one and renaming its socket out. Only those
// older than a minute: a younger one may be a shim starting right now.
func removeStalePrivateDirs(dir string) {
	old, _ := filepath.Glob(filepath.Join(dir, privatePrefix+"*"))
	for _, d := range old {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() && time.Since(fi.ModTime()) > time.Minute {
			_ = os.RemoveAll(d)
		}
	}
}

// unixListener removes its socket from path on Close, as net's own listener
// does for the name it bound, unless something else has replaced it there.
type unixListener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.fi) {
		_ = os.Remove(l.path)
	}
	return err
}

// LookupGroup resolves a group name or numeric id; "" means "leave as is" (-1).
func LookupGroup(g string) (int, error) {
	if g == "" {
		return -1, nil
	}
	if id, err := strconv.Atoi(g); err == nil {
		if id < 0 {
			return 0, fmt.Errorf("server.socket_group: negative gid %d", id)
		}
		return id, nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("server.socket_group: %w", err)
	}
	return strconv.Atoi(gr.Gid)
}
