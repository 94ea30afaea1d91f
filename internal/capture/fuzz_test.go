package capture

import (
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
