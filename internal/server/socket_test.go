package server

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The CRI socket never exists at its final path with another mode (or group)
// than the one asked for: at the first moment the path appears it already has
// that mode, and its attributes never change there afterwards (a chmod or
// chown after bind would show as IN_ATTRIB on the final name).
func TestListenUnixNeverWiderAtFinalPath(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "shim.sock")
	done := filepath.Join(dir, "done")
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		firstMode os.FileMode // at the first event naming the socket
		appeared  bool
		attribs   int // IN_ATTRIB on the final name after it appeared
	}
	res := make(chan seen, 1)
	go func() {
		var s seen
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil {
				res <- s
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
				off += unix.SizeofInotifyEvent + int(ev.Len)
				switch {
				case name == "done":
					res <- s
					return
				case name != "shim.sock":
				case ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && !s.appeared:
					s.appeared = true
					if fi, err := os.Lstat(sock); err == nil {
						s.firstMode = fi.Mode().Perm()
					}
				case ev.Mask&unix.IN_ATTRIB != 0 && s.appeared:
					s.attribs++
				}
			}
		}
	}()
	l, err := ListenUnix(sock, 0o600, os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.WriteFile(done, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := <-res
	if !s.appeared {
		t.Fatal("no creation of the socket at its final path seen")
	}
	if s.firstMode != 0o600 {
		t.Errorf("socket first seen at its final path with mode %o, want 0600", s.firstMode)
	}
	if s.attribs != 0 {
		t.Errorf("socket's mode or group changed %d time(s) after it appeared at its final path: it was reachable with other permissions", s.attribs)
	}
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v (%v), want a socket with mode 0600", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "shim.sock" && e.Name() != "done" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	l.Close()
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left at its path after Close: %v", err)
	}
}

// A private directory a start killed before its rename left behind is removed
// by a later start once it is old enough; a fresh one (a shim starting at the
// same moment) is left alone.
func TestListenUnixRemovesStalePrivateDirs(t *testing.T) {
	dir := t.TempDir()
	stale, fresh := filepath.Join(dir, privatePrefix+"old"), filepath.Join(dir, privatePrefix+"new")
	for _, d := range []string{stale, fresh} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(stale, long, long); err != nil {
		t.Fatal(err)
	}
	l, err := ListenUnix(filepath.Join(dir, "shim.sock"), 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale private directory kept: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh private directory removed: %v", err)
	}
}
