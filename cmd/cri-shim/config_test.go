package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cri-shim/cri-shim/internal/config"
)

// `config default` prints config.Marshal of the defaults (whose keys
// internal/config's TestDefaultAndShippedExampleShowEveryKey compares with
// the struct and deploy/config.toml), and `config check` accepts it.
func TestConfigDefaultRoundTripsThroughCheck(t *testing.T) {
	code, out, stderr := runOut(t, "config", "default")
	if code != 0 || stderr != "" {
		t.Fatalf("config default: exit %d, %s", code, stderr)
	}
	want, err := config.Marshal(config.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Fatalf("config default printed something else than config.Marshal of the defaults:\n%s", out)
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = runOut(t, "config", "check", p)
	if code != 0 || out != p+": ok\n" {
		t.Fatalf("config check of config default: exit %d, %q %s", code, out, stderr)
	}
}
