package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// writeArchiveCheckpoint writes a checkpoint of one container "app" whose
// archive has the members a restore needs.
func writeArchiveCheckpoint(t *testing.T, dir string) {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range []struct{ name, body string }{
		{"config.dump", `{"rootfsImageRef":"sha256:` + strings.Repeat("e", 64) + `"}`}, {"spec.dump", "{}"}, {"status.dump", "{}"}, {"rootfs-diff.tar", "x"},
		{"checkpoint/", ""}, {"checkpoint/pages-1.img", strings.Repeat("p", 8192)},
	} {
		h := &tar.Header{Name: m.name, Mode: 0o600, Size: int64(len(m.body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(m.name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o700
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, m.body)
	}
	tw.Close()
	m := layout.Manifest{FormatVersion: layout.Version, CheckpointedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Pod:        layout.PodInfo{Name: "web", Namespace: "default", UID: "uid-web"},
		Containers: []layout.ContainerEntry{{Name: "app", Archive: layout.ArchiveName("app"), SizeBytes: int64(b.Len())}}}
	mb, _ := json.Marshal(m)
	for name, body := range map[string][]byte{layout.ArchiveName("app"): b.Bytes(), layout.SandboxFile: []byte(`{}`), layout.ManifestFile: mb} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// push prints the pushed digest; pull writes the same files under the new
// name and says how to restore it; plain lines off a terminal.
func TestCheckpointPushPull(t *testing.T) {
	dir := t.TempDir()
	cfg := nodeConfig(t, dir, filepath.Join(dir, "shim.sock"))
	root := filepath.Join(dir, "checkpoints")
	writeArchiveCheckpoint(t, filepath.Join(root, "cp-web"))
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/checkpoints/web:v1"

	code, out, stderr := runOut(t, "checkpoint", "push", "cp-web", ref, "--plain-http", "-o", "json", "--config", cfg)
	if code != 0 {
		t.Fatalf("push: exit %d: %s%s", code, out, stderr)
	}
	var pushed transferResult
	if err := json.Unmarshal([]byte(out), &pushed); err != nil {
		t.Fatalf("push -o json: %v: %q", err, out)
	}
	if !strings.HasPrefix(pushed.Digest, "sha256:") || pushed.Ref != strings.TrimSuffix(ref, ":v1")+"@"+pushed.Digest ||
		pushed.Name != "cp-web" || strings.Join(pushed.Containers, ",") != "app" {
		t.Fatalf("push -o json: %+v", pushed)
	}
	if !strings.Contains(stderr, "pushing "+filepath.Join(root, "cp-web")+" to "+ref) {
		t.Errorf("push progress (stderr with -o json): %q", stderr)
	}

	code, out, stderr = runOut(t, "checkpoint", "pull", pushed.Ref, "copy", "--plain-http", "--config", cfg)
	if code != 0 {
		t.Fatalf("pull: exit %d: %s%s", code, out, stderr)
	}
	for _, want := range []string{"pulling " + pushed.Ref, "pulled copy (default/web: app,", "digest: " + pushed.Digest, `restore-from: "copy"`} {
		if !strings.Contains(out, want) {
			t.Errorf("pull output lacks %q:\n%s", want, out)
		}
	}
	for _, rel := range []string{layout.ManifestFile, layout.SandboxFile, layout.ArchiveName("app")} {
		a, _ := os.ReadFile(filepath.Join(root, "cp-web", rel))
		b, err := os.ReadFile(filepath.Join(root, "copy", rel))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: pulled copy differs (%v)", rel, err)
		}
	}

	// Plain HTTP only when asked.
	code, _, stderr = runOut(t, "checkpoint", "pull", pushed.Ref, "again", "--config", cfg)
	if code != 1 || !strings.Contains(stderr, "--plain-http") {
		t.Errorf("pull over HTTP without --plain-http: exit %d, %q", code, stderr)
	}
}

// tlsSniffer counts the connections whose first byte opens a TLS handshake
// (record type 22): HTTPS tried on a plain-HTTP registry.
type tlsSniffer struct {
	net.Listener
	handshakes *atomic.Int32
}

func (l tlsSniffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffedConn{Conn: c, handshakes: l.handshakes}, nil
}

type sniffedConn struct {
	net.Conn
	handshakes *atomic.Int32
	seen       bool
}

func (c *sniffedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.seen && n > 0 {
		c.seen = true
		if p[0] == 0x16 {
			c.handshakes.Add(1)
		}
	}
	return n, err
}

// checkpoint pull: --max-bytes defaults to the config's pull_max_bytes,
// refuses a value below 1, and --plain-http never tries HTTPS.
func TestCheckpointPullLimitsAndScheme(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "checkpoints")
	writeArchiveCheckpoint(t, filepath.Join(root, "cp-web"))
	cfg := nodeConfig(t, dir, filepath.Join(dir, "shim.sock"))
	small := filepath.Join(dir, "small.toml")
	body, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(small, bytes.Replace(body, []byte("[checkpoint]\n"), []byte("[checkpoint]\npull_max_bytes = 1000\n"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	var handshakes atomic.Int32
	srv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Listener = tlsSniffer{Listener: srv.Listener, handshakes: &handshakes}
	srv.Start()
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/checkpoints/web:v1"
	if code, out, stderr := runOut(t, "checkpoint", "push", "cp-web", ref, "--plain-http", "--config", cfg); code != 0 {
		t.Fatalf("push: exit %d: %s%s", code, out, stderr)
	}

	for i, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--max-bytes", "-5"}, 2, "--max-bytes -5: must be a number of bytes above 0"},
		{[]string{"--max-bytes=0"}, 2, "--max-bytes 0: must be a number of bytes above 0"},
		// pull_max_bytes = 1000 of the config; the archive is larger.
		{[]string{"--config", small}, 1, "checkpoint archives exceed the cap of 1000 bytes"},
		{[]string{"--config", small, "--max-bytes", "999"}, 1, "the cap of 999 bytes"},
		{[]string{"--config", small, "--max-bytes", "1000000"}, 0, ""},
		// The default config's 16 GiB.
		{[]string{"--config", cfg}, 0, ""},
	} {
		args := append([]string{"checkpoint", "pull", ref, fmt.Sprintf("copy%d", i), "--plain-http"}, tc.args...)
		if !slices.Contains(tc.args, "--config") {
			args = append(args, "--config", cfg)
		}
		code, _, stderr := runOut(t, args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
	if n := handshakes.Load(); n != 0 {
		t.Errorf("%d TLS handshakes sent to the plain-HTTP registry", n)
	}
}
