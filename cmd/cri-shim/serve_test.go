package main

import (
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
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
		"[runtime]\nendpoint = \"" + filepath.Join(dir, "absent.sock") + "\"\n[metrics]\naddress = \"\"\n[log]\nformat = \"text\"\n"
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
