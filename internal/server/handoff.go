package server

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// The CRI socket outlives the shim process, so that a restart or an upgrade
// never refuses the kubelet a connection: connections made meanwhile wait in
// the socket's backlog until the next process accepts them.
//
//   - Under systemd with cri-shim.socket, systemd holds the socket and passes
//     it to every start of the service (LISTEN_FDS, sd_listen_fds(3)).
//   - Without systemd (or with the service alone), an in-place upgrade
//     (SIGUSR2, `systemctl reload cri-shim`) drains the gRPC server, stops the
//     features, and exec(2)s the binary now at the shim's path in the same
//     process, with the listening socket left open across the exec and named
//     in CRI_SHIM_LISTEN_FD. Same PID: systemd's MainPID and the watchdog stay.

// Environment of an in-place upgrade: the inherited socket's descriptor, and
// whether the shim created the socket (and removes its path when it stops for
// good) or systemd did.
const (
	envListenFD    = "CRI_SHIM_LISTEN_FD"
	envListenOwned = "CRI_SHIM_LISTEN_OWNED"
	envListenPath  = "CRI_SHIM_LISTEN_PATH"
)

// Listener is the CRI socket across server runs and exec'd upgrades. Each
// Run serves on Serving(); its gRPC server's stop only ends Accept.
type Listener struct {
	l     *net.UnixListener
	path  string
	owned bool   // created by this shim (not systemd): its path goes with the final Close
	from  string // where it came from, for the log
	fi    os.FileInfo
}

// Listen returns the CRI socket for path: inherited from an in-place upgrade
// or from systemd socket activation when there is one, else a new one made by
// ListenUnix with mode and gid. An inherited socket must be a unix stream
// socket listening at path: a unit listening elsewhere than server.listen is a
// configuration error, not something to guess around.
func Listen(path string, mode os.FileMode, gid int) (*Listener, error) {
	l, from, owned, at, err := inherited()
	if err != nil {
		return nil, err
	}
	if l == nil {
		nl, err := ListenUnix(path, mode, gid)
		if err != nil {
			return nil, err
		}
		ul := nl.(*unixListener)
		return &Listener{l: ul.UnixListener, path: path, owned: true, from: "created", fi: ul.fi}, nil
	}
	l.SetUnlinkOnClose(false)
	if at != path {
		l.Close()
		return nil, fmt.Errorf("listen %s: the inherited socket (%s) listens at %q; server.listen must name the same path", path, from, at)
	}
	fi, _ := os.Lstat(path)
	return &Listener{l: l, path: path, owned: owned, from: from, fi: fi}, nil
}

// inherited takes the socket an upgrade or systemd passed, if any, and
// clears the environment that named it so children do not see it. at is the
// path the socket is reachable at: systemd's bind address, or the path the
// upgrading shim served (its socket was bound under a private name and
// renamed there, so its own address says nothing).
func inherited() (l *net.UnixListener, from string, owned bool, at string, err error) {
	if v, ok := os.LookupEnv(envListenFD); ok {
		owned, at = os.Getenv(envListenOwned) == "1", os.Getenv(envListenPath)
		os.Unsetenv(envListenFD)
		os.Unsetenv(envListenOwned)
		os.Unsetenv(envListenPath)
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			return nil, "", false, "", fmt.Errorf("%s=%q: not a descriptor number", envListenFD, v)
		}
		l, err := fileListener(os.NewFile(uintptr(fd), "cri-socket"))
		if err != nil {
			return nil, "", false, "", fmt.Errorf("%s=%d: %w", envListenFD, fd, err)
		}
		return l, "in-place upgrade", owned, at, nil
	}
	files := activation.Files(true)
	switch len(files) {
	case 0:
		return nil, "", false, "", nil
	case 1:
	default:
		for _, f := range files {
			f.Close()
		}
		return nil, "", false, "", fmt.Errorf("systemd passed %d sockets; cri-shim.socket must listen on one (server.listen)", len(files))
	}
	l, err = fileListener(files[0])
	if err != nil {
		return nil, "", false, "", fmt.Errorf("socket from systemd: %w", err)
	}
	return l, "systemd socket activation", false, l.Addr().String(), nil
}

// fileListener makes a unix listener of f (and closes f: the listener holds
// its own descriptor).
func fileListener(f *os.File) (*net.UnixListener, error) {
	defer f.Close()
	nl, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	l, ok := nl.(*net.UnixListener)
	if !ok {
		nl.Close()
		return nil, fmt.Errorf("not a unix socket (%s)", nl.Addr().Network())
	}
	return l, nil
}

// From says where the socket came from: created, systemd socket activation,
// in-place upgrade.
func (l *Listener) From() string { return l.from }

// Serving is the listener one server run serves on: its Close (the gRPC
// server's stop) ends Accept but leaves the socket listening.
func (l *Listener) Serving() net.Listener {
	_ = l.l.SetDeadline(time.Time{})
	return &servingListener{UnixListener: l.l}
}

// Close closes the socket for good; a socket the shim created is removed from
// its path unless something else has replaced it there.
func (l *Listener) Close() error {
	err := l.l.Close()
	if l.owned && l.fi != nil {
		if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.fi) {
			_ = os.Remove(l.path)
		}
	}
	return err
}

// Exec replaces the process with exe (argv, env plus the socket's
// descriptor), the socket staying open and listening across the exec. It
// returns only when the exec failed; the socket is then still this
// process's, and serving can go on.
func (l *Listener) Exec(exe string, argv, env []string) error {
	rc, err := l.l.SyscallConn()
	if err != nil {
		return err
	}
	// A descriptor without close-on-exec, numbered above the runtime's own;
	// it is closed again if the exec fails.
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD, 3) }); err != nil {
		return err
	}
	if derr != nil {
		return fmt.Errorf("duplicate the socket: %w", derr)
	}
	owned := "0"
	if l.owned {
		owned = "1"
	}
	env = append(withoutListenEnv(env), envListenFD+"="+strconv.Itoa(fd), envListenOwned+"="+owned, envListenPath+"="+l.path)
	err = syscall.Exec(exe, argv, env)
	unix.Close(fd)
	return fmt.Errorf("exec %s: %w", exe, err)
}

func withoutListenEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if hasKey(kv, envListenFD) || hasKey(kv, envListenOwned) || hasKey(kv, envListenPath) || hasKey(kv, "LISTEN_PID") || hasKey(kv, "LISTEN_FDS") || hasKey(kv, "LISTEN_FDNAMES") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func hasKey(kv, key string) bool {
	return len(kv) > len(key) && kv[:len(key)] == key && kv[len(key)] == '='
}

// servingListener is one run's view of the socket: Close makes a blocked
// Accept return (a deadline in the past) and every later Accept fail, without
// closing the descriptor.
type servingListener struct {
	*net.UnixListener
	closed atomic.Bool
}

func (s *servingListener) Accept() (net.Conn, error) {
	c, err := s.UnixListener.Accept()
	if err != nil && s.closed.Load() {
		return nil, net.ErrClosed
	}
	if err == nil && s.closed.Load() {
		// Accepted in the instant the run ended (readable just as the
		// deadline passed; a later Accept fails before accept(2)). It
		// cannot go back to the backlog: closed before a byte is read, so
		// no call was in flight on it, and the client connects again.
		c.Close()
		return nil, net.ErrClosed
	}
	return c, err
}

func (s *servingListener) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.UnixListener.SetDeadline(time.Unix(1, 0))
}
