package layout

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pulled writes a pulled checkpoint of one container whose archive holds
// size bytes, the manifest saying want.
func pulled(t *testing.T, root string, size, want int64) string {
	t.Helper()
	dir := filepath.Join(root, PulledDir(strings.Repeat("a", 64)))
	if err := os.MkdirAll(filepath.Join(dir, "containers"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := ContainerEntry{Name: "main", Archive: ArchiveName("main"), SizeBytes: want}
	if err := os.WriteFile(filepath.Join(dir, c.Archive), make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteManifest(dir, &Manifest{FormatVersion: Version, Containers: []ContainerEntry{c}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReadPulled(t *testing.T) {
	root := t.TempDir()
	dir := pulled(t, root, 10, 10)
	if m, err := ReadPulled(dir); err != nil || len(m.Containers) != 1 {
		t.Fatalf("complete pulled checkpoint: %v", err)
	}
	if _, err := ReadPulled(filepath.Join(root, PulledDir(strings.Repeat("b", 64)))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing directory: %v, want ErrNotExist", err)
	}
	short := pulled(t, t.TempDir(), 5, 10)
	if _, err := ReadPulled(short); !errors.Is(err, ErrPulledIncomplete) {
		t.Fatalf("archive shorter than its manifest: %v, want ErrPulledIncomplete", err)
	}
	file := filepath.Join(t.TempDir(), PulledDir(strings.Repeat("c", 64)))
	os.WriteFile(file, nil, 0o600)
	if _, err := ReadPulled(file); !errors.Is(err, ErrPulledIncomplete) {
		t.Fatalf("a file under the name: %v, want ErrPulledIncomplete", err)
	}
}

func TestRemoveIncompletePulled(t *testing.T) {
	short := pulled(t, t.TempDir(), 5, 10)
	if removed, err := RemoveIncompletePulled(short); err != nil || !removed {
		t.Fatalf("incomplete: removed=%v err=%v", removed, err)
	}
	if left, _ := os.ReadDir(filepath.Dir(short)); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	// Complete once renamed (pulled again meanwhile): put back, not removed.
	full := pulled(t, t.TempDir(), 10, 10)
	if removed, err := RemoveIncompletePulled(full); err != nil || removed {
		t.Fatalf("complete: removed=%v err=%v", removed, err)
	}
	if _, err := ReadPulled(full); err != nil {
		t.Fatalf("complete checkpoint not put back: %v", err)
	}
	if removed, err := RemoveIncompletePulled(filepath.Join(t.TempDir(), "oci-none")); err != nil || removed {
		t.Fatalf("missing: removed=%v err=%v", removed, err)
	}
}

func TestCheckNewNameAndImageRef(t *testing.T) {
	for _, n := range []string{ObjectDirPrefix + "x", PulledDirPrefix + "x"} {
		if err := CheckNewName(n); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("CheckNewName(%q) = %v, want reserved", n, err)
		}
	}
	if err := CheckNewName("nightly"); err != nil {
		t.Errorf("CheckNewName(nightly) = %v", err)
	}
	for s, want := range map[string]bool{"nightly": false, "reg.example/ns/app:1": true, "app@sha256:ab": true} {
		if IsImageRef(s) != want {
			t.Errorf("IsImageRef(%q) = %v", s, !want)
		}
	}
}
