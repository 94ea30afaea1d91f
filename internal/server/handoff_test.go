package server

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/goroutinetest"
)

func dialOK(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// One run's stop ends its Accept, but the socket keeps listening: a client
// connecting between runs waits in the backlog and the next run accepts it.
func TestSocketListensBetweenRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shim.sock")
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	run := l.Serving()
	blocked := make(chan error, 1)
	go func() { _, err := run.Accept(); blocked <- err }()
	goroutinetest.WaitBlocked(t, "server.(*servingListener).Accept") // in accept(2)
	if err := run.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; err != net.ErrClosed {
		t.Fatalf("Accept after the run's Close: %v, want net.ErrClosed", err)
	}
	if _, err := run.Accept(); err != net.ErrClosed {
		t.Fatalf("a later Accept: %v", err)
	}
	c := dialOK(t, path) // between runs
	next := l.Serving()
	s, err := next.Accept()
	if err != nil {
		t.Fatalf("the next run did not accept the waiting client: %v", err)
	}
	defer s.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := s.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q, %v", b, err)
	}
}

// The final Close removes the socket the shim created, and only that one.
func TestFinalCloseRemovesOwnSocketOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shim.sock")
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("own socket left after Close: %v", err)
	}
	// An inherited socket systemd made (not owned) stays.
	fd := dupListening(t, path)
	t.Setenv(envListenFD, strconv.Itoa(fd))
	t.Setenv(envListenOwned, "0")
	t.Setenv(envListenPath, path)
	l, err = Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("a socket systemd owns was removed: %v", err)
	}
}

// dupListening makes a listening socket at path and returns a descriptor of
// it without close-on-exec, as an upgrading shim passes it.
func dupListening(t *testing.T, path string) int {
	t.Helper()
	os.Remove(path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD, 3)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return fd
}

func TestListenInheritsFromAnUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shim.sock")
	fd := dupListening(t, path)
	t.Setenv(envListenFD, strconv.Itoa(fd))
	t.Setenv(envListenOwned, "1")
	t.Setenv(envListenPath, path)
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.From() != "in-place upgrade" || !l.owned {
		t.Fatalf("from %q owned %v", l.From(), l.owned)
	}
	if _, ok := os.LookupEnv(envListenFD); ok {
		t.Fatal("the descriptor's variable is left for children to see")
	}
	c := dialOK(t, path)
	s, err := l.Serving().Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	c.Close()
}

func TestListenRefusesABadInheritedSocket(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, want string
		fd         func() string
	}{
		{"not a number", "not a descriptor number", func() string { return "three" }},
		{"stdin", "not a descriptor number", func() string { return "0" }},
		{"other path", "listens at", func() string {
			t.Setenv(envListenPath, filepath.Join(dir, "other.sock"))
			return strconv.Itoa(dupListening(t, filepath.Join(dir, "other.sock")))
		}},
		{"not a socket", envListenFD, func() string {
			f, _ := os.Open(dir)
			defer f.Close()
			fd, _ := unix.FcntlInt(f.Fd(), unix.F_DUPFD, 3)
			return strconv.Itoa(fd)
		}},
		{"closed number", envListenFD, func() string { return "987" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envListenFD, tc.fd())
			l, err := Listen(filepath.Join(dir, "shim.sock"), 0o660, -1)
			if err == nil {
				l.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: want it to say %q", err, tc.want)
			}
		})
	}
}

// Under systemd socket activation (LISTEN_PID, LISTEN_FDS, the socket as
// descriptor 3) the shim serves on systemd's socket. Run in a child process,
// the only way to give it descriptor 3 and its own pid in LISTEN_PID.
func TestListenTakesSystemdSocket(t *testing.T) {
	if os.Getenv("CRI_SHIM_TEST_ACTIVATION_CHILD") != "" {
		path := os.Getenv("CRI_SHIM_TEST_SOCKET")
		l, err := Listen(path, 0o660, -1)
		if err != nil {
			t.Fatal(err)
		}
		if l.From() != "systemd socket activation" || l.owned {
			t.Fatalf("from %q owned %v", l.From(), l.owned)
		}
		if os.Getenv("LISTEN_FDS") != "" {
			t.Fatal("LISTEN_FDS left for children")
		}
		c, err := l.Serving().Accept()
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("ok"))
		c.Close()
		l.Close()
		return
	}
	path := filepath.Join(t.TempDir(), "shim.sock")
	fd := dupListening(t, path)
	f := os.NewFile(uintptr(fd), "sock")
	defer f.Close()
	// sh's exec keeps its pid, so LISTEN_PID=$$ names the test binary.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" -test.run '^TestListenTakesSystemdSocket$' -test.v`, os.Args[0])
	cmd.Env = append(os.Environ(), "CRI_SHIM_TEST_ACTIVATION_CHILD=1", "CRI_SHIM_TEST_SOCKET="+path)
	cmd.ExtraFiles = []*os.File{f} // descriptor 3
	out := make(chan []byte, 1)
	go func() { b, _ := cmd.CombinedOutput(); out <- b }()
	c := dialOK(t, path)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b := make([]byte, 2)
	if _, err := c.Read(b); err != nil || string(b) != "ok" {
		t.Fatalf("the activated child did not serve: %q %v\n%s", b, err, <-out)
	}
	if o := <-out; !strings.Contains(string(o), "PASS") {
		t.Fatalf("child:\n%s", o)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the child removed systemd's socket: %v", err)
	}
}
