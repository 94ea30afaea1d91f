package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/metrics"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// /readyz is 503 with the reason while state writes fail, and ready again
// once a write succeeds; the write metrics are served.
func TestReadyzNotReadyWhileStateWritesFail(t *testing.T) {
	mc := metrics.New(proxy.CRIMethods())
	mc.Registry.MustRegister(statefile.Collectors()...)
	srv := httptest.NewServer(httpMux(mc, func(context.Context) error { return nil }, statefile.Healthy, false))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	dir := t.TempDir()
	if err := statefile.WriteFile(filepath.Join(dir, "ok"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz with writes succeeding: %d %q", code, body)
	}
	// A write fails, as on a full or read-only disk.
	if err := statefile.WriteFile(filepath.Join(dir, "missing", "rec"), nil, 0o600); err == nil {
		t.Fatal("test setup: the write did not fail")
	}
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "state not writable") || !strings.Contains(body, "missing/rec") {
		t.Fatalf("/readyz after a failed write: %d %q, want 503 naming the write", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz after a failed write: %d, want 200 (the process serves)", code)
	}
	_, m := get("/metrics")
	if !strings.Contains(m, "cri_shim_state_writable 0") || !strings.Contains(m, "cri_shim_state_write_errors_total") {
		t.Fatalf("metrics do not show the failing writes:\n%s", grepLines(m, "cri_shim_state"))
	}
	if err := statefile.WriteFile(filepath.Join(dir, "ok"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz after a successful write: %d %q", code, body)
	}
	// Both reasons are given when both hold.
	srv2 := httptest.NewServer(httpMux(mc, func(context.Context) error { return errors.New("no runtime") },
		func() error { return os.ErrPermission }, false))
	defer srv2.Close()
	resp, err := http.Get(srv2.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "state not writable") || !strings.Contains(string(b), "no runtime") {
		t.Fatalf("/readyz with both failing: %d %q", resp.StatusCode, b)
	}
}
