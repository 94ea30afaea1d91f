package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serve under systemd: READY=1 reaches $NOTIFY_SOCKET once the CRI socket
// accepts calls, and SIGTERM shuts down cleanly (exit 0, socket removed).
func TestServeNotifiesReadyAndStopsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	notify := filepath.Join(dir, "notify.sock")
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	t.Setenv("NOTIFY_SOCKET", notify)
	cfg := filepath.Join(dir, "config.toml")
	listen := filepath.Join(dir, "shim.sock")
	body := "state_dir = \"" + dir + "\"\n[server]\nlisten = \"" + listen + "\"\nshutdown_timeout = \"2s\"\n" +
		"[runtime]\nendpoint = \"" + filepath.Join(dir, "absent.sock") + "\"\n[metrics]\naddress = \"\"\n[log]\nformat = \"text\"\n" +
		"[checkpoint]\nroot = \"" + filepath.Join(dir, "checkpoints") + "\"\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() { done <- run([]string{"serve", "--config", cfg}) }()

	buf := make([]byte, 256)
	_ = nl.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := nl.Read(buf)
	if err != nil {
		t.Fatalf("no sd_notify message: %v", err)
	}
	if !strings.Contains(string(buf[:n]), "READY=1") {
		t.Fatalf("sd_notify sent %q", buf[:n])
	}
	c, err := net.Dial("unix", listen)
	if err != nil {
		t.Fatalf("READY sent but the socket does not accept: %v", err)
	}
	c.Close()

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after SIGTERM", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
	if _, err := os.Stat(listen); !os.IsNotExist(err) {
		t.Fatalf("socket left after shutdown: %v", err)
	}
}

// server.max_procs sets GOMAXPROCS unless the environment variable does.
func TestSetMaxProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(2)
	t.Setenv("GOMAXPROCS", "")
	if got := setMaxProcs(1); got != 1 {
		t.Fatalf("max_procs 1: GOMAXPROCS %d", got)
	}
	if got := setMaxProcs(0); got != 1 {
		t.Fatalf("max_procs 0 changed GOMAXPROCS to %d", got)
	}
	runtime.GOMAXPROCS(2)
	t.Setenv("GOMAXPROCS", "2")
	if got := setMaxProcs(1); got != 2 {
		t.Fatalf("GOMAXPROCS=2 in the environment, max_procs 1: got %d, want the environment's 2", got)
	}
}

// slackOf reads a thread's timer slack in nanoseconds.
func slackOf(t *testing.T, tid string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + tid + "/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSetTimerSlack(t *testing.T) {
	runtime.LockOSThread()
	orig, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	runtime.UnlockOSThread()
	defer func() { _ = setTimerSlack(time.Duration(orig)) }()
	const want = 3 * time.Millisecond
	if orig == int(want) {
		t.Fatalf("the process already runs with %v; the test could not tell a change", want)
	}
	runtime.LockOSThread()
	err := setTimerSlack(want)
	own, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	runtime.UnlockOSThread()
	if own != int(want) {
		t.Fatalf("calling thread: slack %d ns, want %d", own, want.Nanoseconds())
	}
	if os.Geteuid() != 0 {
		// Other threads need CAP_SYS_NICE: the refusal must be reported,
		// and the calling thread has the slack all the same.
		if err == nil || !errors.Is(err, syscall.EPERM) {
			t.Fatalf("not root: want EPERM for the other threads, got %v", err)
		}
		t.Skip("not root: the other threads' slack cannot be set; the rest of this test needs root")
	}
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tasks {
		if got := slackOf(t, e.Name()); got != int64(want) {
			t.Errorf("thread %s: slack %d ns, want %d", e.Name(), got, want.Nanoseconds())
		}
	}
	// Threads the runtime starts later inherit it: hold more threads than
	// exist now, each locked and asking its own slack.
	n := len(tasks) + 2
	got := make(chan uintptr, n)
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			v, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
			got <- uintptr(v)
			<-release
		}()
	}
	for i := 0; i < n; i++ {
		if v := <-got; v != uintptr(want) {
			t.Errorf("a thread started afterwards has slack %d ns, want %d", v, want.Nanoseconds())
		}
	}
	close(release)
	// 0 changes nothing.
	if err := setTimerSlack(0); err != nil {
		t.Fatal(err)
	}
	if got := slackOf(t, strconv.Itoa(os.Getpid())); got != int64(want) {
		t.Fatalf("timer_slack 0 changed the slack to %d", got)
	}
}
