package capture

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CaptureWatch finds the captures containerd runs and waits for their end.
// A shim killed mid-capture does not stop containerd's: CRIU goes on with the
// paused containers and, when it ends, puts the freezer back as it found it
// (frozen), so a resume is only lasting once the capture has ended.
type CaptureWatch interface {
	// Running returns the captures of the containers ids running now.
	Running(ids []string) []RunningCapture
	// Wait returns once capture c has ended, or with ctx's error.
	Wait(ctx context.Context, c RunningCapture) error
}

// RunningCapture is one capture in progress: the process that lives exactly
// as long as it.
type RunningCapture struct {
	// ID is the container captured.
	ID string
	// Pid is the capturing process.
	Pid int
}

// anyCaptureRunning returns a container of ids that containerd is still
// capturing.
func (s *Service) anyCaptureRunning(ids []string) (string, bool) {
	if c := s.watch.Running(ids); len(c) > 0 {
		return c[0].ID, true
	}
	return "", false
}

// waitCaptures returns once no capture of ids runs, or with ctx's error. Each
// capture seen is waited for, then the host is looked at again.
func (s *Service) waitCaptures(ctx context.Context, ids []string) error {
	for {
		caps := s.watch.Running(ids)
		if len(caps) == 0 {
			return nil
		}
		for _, c := range caps {
			if err := s.watch.Wait(ctx, c); err != nil {
				return err
			}
		}
	}
}

// HostCaptures watches this host's runc checkpoint processes (the watch a
// Service uses when Config.Captures is nil).
func HostCaptures() CaptureWatch { return hostCaptures{every: 10 * time.Millisecond} }

// hostCaptures watches this host's runc checkpoint processes. containerd's
// runc shim runs a capture as "runc [global flags] checkpoint [flags] <id>"
// (go-runc's Checkpoint, which puts the container ID last) and waits for CRIU
// under it, so the runc process lives exactly as long as the capture.
type hostCaptures struct {
	// every is how often a process is looked at when the kernel gives no
	// pidfd to wait on (before Linux 5.3, or a seccomp filter refusing it).
	every time.Duration
}

// Running scans /proc.
func (h hostCaptures) Running(ids []string) []RunningCapture {
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil
	}
	var out []RunningCapture
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		if id, ok := captureOf(pid, ids); ok {
			out = append(out, RunningCapture{ID: id, Pid: pid})
		}
	}
	return out
}

// Wait waits on a pidfd of the process: the kernel makes it readable when
// the process exits (pidfd_open(2)). The process is checked to be the capture
// after the pidfd is open, so a PID reused meanwhile is not waited for.
func (h hostCaptures) Wait(ctx context.Context, c RunningCapture) error {
	fd, err := unix.PidfdOpen(c.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return h.poll(ctx, c)
	}
	defer unix.Close(fd)
	if _, ok := captureOf(c.Pid, []string{c.ID}); !ok {
		return nil
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// A bounded poll, so that ctx's end is seen.
		n, err := unix.Poll(fds, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return h.poll(ctx, c)
		}
		if n > 0 {
			return nil
		}
	}
}

// poll looks at the process every h.every until it is no longer the capture.
func (h hostCaptures) poll(ctx context.Context, c RunningCapture) error {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		if _, ok := captureOf(c.Pid, []string{c.ID}); !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// captureOf reports which container of ids process pid is a runc checkpoint
// of. Only root's processes count: any user can name a process "runc" and
// give it a container ID, which would stall a resume. An exited process
// (a zombie has an empty cmdline) is none.
func captureOf(pid int, ids []string) (string, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	fi, err := os.Stat(dir)
	if err != nil || !ownedByRoot(fi) {
		return "", false
	}
	b, err := os.ReadFile(dir + "/cmdline")
	if err != nil || len(b) == 0 {
		return "", false
	}
	argv := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	for _, id := range ids {
		if isRuncCheckpoint(argv, id) {
			return id, true
		}
	}
	return "", false
}

func ownedByRoot(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0
}

// isRuncCheckpoint reports whether argv is a runc checkpoint of container id.
func isRuncCheckpoint(argv [][]byte, id string) bool {
	if len(argv) < 3 || filepath.Base(string(argv[0])) != "runc" || string(argv[len(argv)-1]) != id {
		return false
	}
	return slices.ContainsFunc(argv[1:len(argv)-1], func(a []byte) bool { return string(a) == "checkpoint" })
}
