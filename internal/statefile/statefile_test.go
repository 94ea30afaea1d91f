package statefile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestWriteFileReplacesWithMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rec.json")
	if err := WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "two" {
		t.Fatalf("read %q, %v; want two", b, err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
}

func TestFailedWriteMarksUnhealthyUntilASuccess(t *testing.T) {
	dir := t.TempDir()
	before := testutil.ToFloat64(writeErrors)
	err := WriteFile(filepath.Join(dir, "missing", "rec"), []byte("x"), 0o600)
	if !errors.Is(err, ErrNotDurable) {
		t.Fatalf("err %v, want ErrNotDurable", err)
	}
	if Healthy() == nil {
		t.Fatal("healthy after a failed write")
	}
	if got := testutil.ToFloat64(writeErrors) - before; got != 1 {
		t.Fatalf("write errors counted %v, want 1", got)
	}
	if testutil.ToFloat64(writable) != 0 {
		t.Fatal("writable gauge still 1")
	}
	if err := WriteFile(filepath.Join(dir, "rec"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Healthy(); err != nil {
		t.Fatalf("still unhealthy after a successful write: %v", err)
	}
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rec")
	if err := WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := Remove(p); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("still there: %v", err)
	}
}
