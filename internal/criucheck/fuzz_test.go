package criucheck

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// maxCheckAlloc bounds what one Check may allocate in total, whatever the
// images hold: entries are read one at a time into a buffer of at most
// maxEntryBytes.
const maxCheckAlloc = 64 << 20

// FuzzCheck replaces one image of a checkpoint the spec allows with the
// fuzzer's bytes: Check must return (a refusal or nil), never panic or
// hang, and stay within its allocation bound.
func FuzzCheck(f *testing.F) {
	spec := criutest.DefaultSpec()
	withSeccomp(spec)
	base := f.TempDir()
	if err := criutest.ForSpec(spec).Write(base); err != nil {
		f.Fatal(err)
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		f.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	for i, n := range names {
		b, err := os.ReadFile(filepath.Join(base, n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		dir := t.TempDir()
		for _, n := range names {
			b, _ := os.ReadFile(filepath.Join(base, n))
			os.WriteFile(filepath.Join(dir, n), b, 0o600)
		}
		os.WriteFile(filepath.Join(dir, names[int(which)%len(names)]), data, 0o600)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_ = Check(dir, spec, Options{})
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > maxCheckAlloc {
			t.Fatalf("Check allocated %d bytes (bound %d)", d, maxCheckAlloc)
		}
	})
}
