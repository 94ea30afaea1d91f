package podmgmt

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// An upgraded shim finds the records an earlier one kept beside the token
// (podmgmt/<sandbox>/pod.json and state): it moves them into the state store
// and keeps the pod, its exit-code overrides, its terminating mark and its
// token at the same path (running pods' recorded requests mount it).
func TestUpgradeMovesOldRecordsIntoTheStore(t *testing.T) {
	dir := t.TempDir()
	const sb = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	old := filepath.Join(dir, "podmgmt", sb)
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"pod.json": `{"sandboxId":"` + sb + `","namespace":"ns","name":"p","declaration":{"container":"orch","port":7070,"version":"1.0"},"overrides":{"c1":3},"terminating":true}`,
		"token":    "secret",
		"state":    "connected 2026-01-01T00:00:00Z dropped=0\n",
	} {
		if err := os.WriteFile(filepath.Join(old, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := New(fakeruntime.Start(t).Client(), dir, openStore(t, dir), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p := m.get(sb)
	if p == nil || p.token != "secret" || !p.terminating.Load() || p.Decl.Port != 7070 {
		t.Fatalf("pod after the upgrade: %+v", p)
	}
	if code, ok := m.exitCode("c1"); !ok || code != 3 {
		t.Fatalf("override after the upgrade: %d %v", code, ok)
	}
	if m.tokenPath(sb) != filepath.Join(old, "token") {
		t.Fatalf("token moved to %s", m.tokenPath(sb))
	}
	for _, n := range []string{"pod.json", "state"} {
		if _, err := os.Stat(filepath.Join(old, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("old %s left: %v", n, err)
		}
	}
	if ch := ReadChannels(dir); len(ch) != 1 || ch[0].State != "connected 2026-01-01T00:00:00Z dropped=0" {
		t.Fatalf("channels after the upgrade: %+v", ch)
	}
	// And a second start (the move done) finds the same pod.
	m2, err := New(fakeruntime.Start(t).Client(), dir, openStore(t, dir), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || m2.get(sb) == nil || !m2.get(sb).terminating.Load() {
		t.Fatalf("second start: %v", err)
	}
}

// A sandbox announced gone on the store's lifecycle is dropped: its channel,
// records and token.
func TestGoneSandboxIsDropped(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	if err := f.m.store.Gone("sb"); err != nil {
		t.Fatal(err)
	}
	if f.m.get("sb") != nil || f.m.active.Load() != 0 || len(f.m.orch) != 0 {
		t.Fatal("pod still known after Gone")
	}
	if _, err := os.Stat(f.m.tokenDir("sb")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("token left: %v", err)
	}
	if keys, _ := f.m.records.List(); len(keys) != 0 {
		t.Fatalf("records left: %v", keys)
	}
}
