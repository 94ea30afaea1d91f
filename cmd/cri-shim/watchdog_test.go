package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The watchdog is fed while the CRI socket accepts connections and stops
// being fed when it does not.
func TestWatchdogFedWhileSocketAccepts(t *testing.T) {
	dir := t.TempDir()
	notify := filepath.Join(dir, "notify.sock")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	t.Setenv("NOTIFY_SOCKET", notify)
	t.Setenv("WATCHDOG_USEC", "100000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	cri := filepath.Join(dir, "cri.sock")
	l, err := net.Listen("unix", cri)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchdog(ctx, "unix://"+cri, slog.New(slog.NewTextHandler(io.Discard, nil)))

	buf := make([]byte, 64)
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := nc.Read(buf)
	if err != nil || string(buf[:n]) != "WATCHDOG=1" {
		t.Fatalf("no watchdog message while the socket accepts: %q, %v", buf[:n], err)
	}
	l.Close()
	// Drain a ping that may have been sent while closing, then expect none.
	nc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = nc.Read(buf)
	nc.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
	if n, err := nc.Read(buf); err == nil {
		t.Fatalf("watchdog fed (%q) although the socket no longer accepts", buf[:n])
	}
}
