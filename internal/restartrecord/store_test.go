package restartrecord

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sbA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// recordsDir is where the pods' records are under stateDir.
func recordsDir(stateDir string) string { return filepath.Join(stateDir, "store", podsBucket) }

func loadOne(t *testing.T, dir string) (*Pod, []error) {
	t.Helper()
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	pods, errs := st.Load()
	if len(pods) > 1 {
		t.Fatalf("%d pods loaded", len(pods))
	}
	if len(pods) == 0 {
		return nil, errs
	}
	return pods[0], errs
}

// A pod's record survives a new store (a restarted shim), and a save after
// the reload replaces it.
func TestPodRecordRoundTripsThroughTheStore(t *testing.T) {
	dir := t.TempDir()
	st, _ := Open(dir)
	for i := 1; i <= 3; i++ {
		if err := st.Save(&Pod{SandboxID: sbA, Restarts: i, Phase: PhaseStartup}); err != nil {
			t.Fatal(err)
		}
	}
	st2, _ := Open(dir)
	if pods, errs := st2.Load(); len(errs) > 0 || len(pods) != 1 || pods[0].Restarts != 3 || pods[0].Phase != PhaseStartup {
		t.Fatalf("reloaded %+v, errors %v", pods, errs)
	}
	if err := st2.Save(&Pod{SandboxID: sbA, Restarts: 4}); err != nil {
		t.Fatal(err)
	}
	if p, _ := loadOne(t, dir); p.Restarts != 4 {
		t.Fatalf("after a reload and a save: restarts %d", p.Restarts)
	}
	if _, err := os.Stat(filepath.Join(recordsDir(dir), sbA+".0")); err != nil {
		t.Fatalf("the record is not in the state store's bucket: %v", err)
	}
}

func TestStoreBothSlotsBadIsReportedNotFatal(t *testing.T) {
	dir := t.TempDir()
	st, _ := Open(dir)
	_ = st.Save(&Pod{SandboxID: sbA})
	_ = st.Save(&Pod{SandboxID: sbA})
	for i := range uint64(2) {
		_ = os.WriteFile(st.Slot(sbA, i), []byte("junk"), 0o600)
	}
	p, errs := loadOne(t, dir)
	if p != nil || len(errs) != 1 || !strings.Contains(errs[0].Error(), "no header line") {
		t.Fatalf("pod %+v errors %v", p, errs)
	}
	if _, err := ReadPods(dir); err == nil {
		t.Fatal("ReadPods hid two unreadable slots")
	}
}
