package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The suite's two tiers (docs/testing.md): the fast one, `make test` (CI's),
// runs every feature on the real stack at small sizes and counts; the long
// one, `make test-long` (CRI_SHIM_E2E_TIER=long), runs the same tests at full
// size and count, and the tests that only the long tier runs (churn, the
// demo, release packaging). Sizes and counts are settings read through
// sized, not copies of tests.
const tierEnv = "CRI_SHIM_E2E_TIER"

// longTier: this run is the long tier.
func longTier() bool { return os.Getenv(tierEnv) == "long" }

// sized is fast in the fast tier and long in the long one.
func sized[T any](fast, long T) T {
	if longTier() {
		return long
	}
	return fast
}

// longOnly skips a test the fast tier leaves to the long one, saying so.
func longOnly(t *testing.T, why string) {
	t.Helper()
	needNode(t)
	if !longTier() {
		t.Skipf("long tier only (make test-long, %s=long): %s", tierEnv, why)
	}
}

// laneSuffix is "" in lane 1 and "-laneN" in lane N (test/stack/env.sh), for
// the files a test keeps under _output.
func laneSuffix() string {
	if l := node.env["LANE"]; l != "" && l != "1" {
		return "-lane" + l
	}
	return ""
}

// machineLock holds a lock every lane on the machine shares, for what must
// not run twice at once (fixed host ports), and returns its release. The
// wait is logged: it is time a lane spent on another.
func machineLock(t testing.TB, name string) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join("/run/lock", "cri-shim-e2e-"+name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if w := time.Since(start); w > time.Second {
		t.Logf("waited %v for another lane's %s", w.Round(time.Second), name)
	}
	return func() { f.Close() }
}
