// Package ckptarchivetest reads container checkpoint archives for tests.
package ckptarchivetest

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"testing"
)

// Read returns the names of the archive at path, in order, and each member's content ("" for directories), failing
// on a name seen twice.
func Read(t testing.TB, path string) (names []string, content map[string][]byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	content = map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, content
		}
		if err != nil {
			t.Fatalf("reading the archive: %v", err)
		}
		if _, dup := content[h.Name]; dup {
			t.Fatalf("%s twice in the archive", h.Name)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		content[h.Name] = b
	}
}
