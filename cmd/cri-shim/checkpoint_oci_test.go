package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
