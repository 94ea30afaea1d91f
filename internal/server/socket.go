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
)

// ListenUnix listens on a unix socket at path with the given mode and group
// (gid < 0 keeps the default). The directory is created if missing. A leftover
// socket is replaced only when nothing answers on it: a second shim must never
// steal the socket of one that is serving.
func ListenUnix(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
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
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: chmod %o: %w", path, mode, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("listen %s: chown to gid %d: %w", path, gid, err)
		}
	}
	return l, nil
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
