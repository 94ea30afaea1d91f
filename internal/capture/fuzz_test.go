package capture

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Options: unknown keys and bad values are errors, never ignored.
func FuzzCheckpointOptions(f *testing.F) {
	f.Add(OptionSequential, "true")
	f.Add(OptionManaged, "no")
	f.Add("x", "y")
	f.Fuzz(func(t *testing.T, k, v string) {
		o, err := parseCheckpointOptions(map[string]string{k: v})
		if k != OptionSequential && k != OptionManaged && err == nil {
			t.Fatalf("unknown key %q accepted", k)
		}
		if err == nil && k == OptionSequential && o.sequential != (v == "1" || strings.EqualFold(v, "t") || strings.EqualFold(v, "true")) {
			t.Fatalf("%q=%q gave %+v", k, v, o)
		}
	})
}

// CRIU's statistics file: whatever it holds is an error or a value, never a
// panic.
func FuzzDumpStats(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, dumpStatsFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = dumpStats(dir)
	})
}
