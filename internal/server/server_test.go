package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/config"
)

func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "missing", "dir", "shim.sock")
	l, err := ListenUnix(sock, 0o660, -1)
	if err != nil {
		t.Fatalf("socket in a missing directory: %v", err)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v (%v)", fi.Mode(), err)
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
	// A live socket is never stolen.
	if _, err := ListenUnix(sock, 0o660, -1); err == nil || !strings.Contains(err.Error(), "another process is serving") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	l.Close()

	// A stale socket (nothing answers) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	ul.Close()
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("test setup: stale socket missing: %v", err)
	}
	l2, err := ListenUnix(stale, 0o600, -1)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l2.Close()

	// A regular file at the path is not ours to delete.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(file, 0o660, -1); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Fatal("regular file was touched")
	}
}

func TestLookupGroup(t *testing.T) {
	for in, want := range map[string]int{"": -1, "0": 0, "root": 0, "123": 123} {
		got, err := LookupGroup(in)
		if err != nil || got != want {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
	for _, bad := range []string{"-1", "no-such-group-xyz"} {
		if _, err := LookupGroup(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Run with the runtime absent: it serves anyway (Unavailable), reports not
// ready, shuts down on cancel and leaves no goroutine behind.
func TestRunLifecycle(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Metrics.Address = freeAddr(t)
	cfg.Server.ShutdownTimeout = config.Duration{Duration: time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- Run(ctx, cfg, log, Options{Ready: func() { close(ready) }}) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("never ready")
	}

	cc, err := grpc.NewClient("unix://"+cfg.Server.Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = runtimeapi.NewRuntimeServiceClient(cc).Version(ctx, &runtimeapi.VersionRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("runtime absent: %v, want Unavailable", err)
	}
	cc.Close()

	get := func(path string) int {
		resp, err := http.Get("http://" + cfg.Metrics.Address + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if path == "/metrics" && !strings.Contains(string(b), `cri_shim_grpc_errors_total{code="Unavailable",method="runtime.v1.RuntimeService/Version"} 1`) {
			t.Errorf("metrics lack the Unavailable error:\n%s", grepLines(string(b), "cri_shim_grpc_errors"))
		}
		return resp.StatusCode
	}
	if c := get("/healthz"); c != 200 {
		t.Errorf("/healthz %d", c)
	}
	if c := get("/readyz"); c != 503 {
		t.Errorf("/readyz with runtime absent: %d, want 503", c)
	}
	if c := get("/metrics"); c != 200 {
		t.Errorf("/metrics %d", c)
	}
	http.DefaultClient.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Stat(cfg.Server.Listen); !os.IsNotExist(err) {
		t.Errorf("socket left behind after shutdown: %v", err)
	}
	n := runtime.NumGoroutine()
	for i := 0; i < 100 && n > base; i++ {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > base {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines: %d before Run, %d after shutdown\n%s", base, n, buf[:runtime.Stack(buf, true)])
	}
}

func TestRunRefusesBadSetup(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(dir)
	cfg.Server.Listen = file
	if err := Run(context.Background(), cfg, log, Options{}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen on a regular file: %v", err)
	}
	cfg.Server.Listen = filepath.Join(dir, "ok.sock")
	cfg.Metrics.Address = "256.0.0.1:1"
	if err := Run(context.Background(), cfg, log, Options{}); err == nil || !strings.Contains(err.Error(), "metrics.address") {
		t.Fatalf("bad metrics address: %v", err)
	}
}

// testConfig is the default configuration with every path of the machine
// (state, checkpoints, sockets) under dir and no metrics listener: a test
// never writes into the real /var/lib/cri-shim or /run, as root or not.
func testConfig(dir string) config.Config {
	cfg := config.DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Checkpoint.Root = filepath.Join(dir, "checkpoints")
	cfg.Server.Listen = filepath.Join(dir, "shim.sock")
	cfg.Runtime.Endpoint = filepath.Join(dir, "absent-runtime.sock")
	cfg.Metrics.Address = ""
	return cfg
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
