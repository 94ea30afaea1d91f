package podstate

import (
	"encoding/json"
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
	st, err := newStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	pods, errs := st.load()
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
	st, _ := newStore(dir)
	for i := 1; i <= 3; i++ {
		if err := st.save(&Pod{SandboxID: sbA, Restarts: i, Phase: PhaseStartup}); err != nil {
			t.Fatal(err)
		}
	}
	st2, _ := newStore(dir)
	if pods, errs := st2.load(); len(errs) > 0 || len(pods) != 1 || pods[0].Restarts != 3 || pods[0].Phase != PhaseStartup {
		t.Fatalf("reloaded %+v, errors %v", pods, errs)
	}
	if err := st2.save(&Pod{SandboxID: sbA, Restarts: 4}); err != nil {
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
	st, _ := newStore(dir)
	_ = st.save(&Pod{SandboxID: sbA})
	_ = st.save(&Pod{SandboxID: sbA})
	for i := range uint64(2) {
		_ = os.WriteFile(st.slot(sbA, i), []byte("junk"), 0o600)
	}
	p, errs := loadOne(t, dir)
	if p != nil || len(errs) != 1 || !strings.Contains(errs[0].Error(), "no header line") {
		t.Fatalf("pod %+v errors %v", p, errs)
	}
	if _, err := ReadPods(dir); err == nil {
		t.Fatal("ReadPods hid two unreadable slots")
	}
}

// Records an earlier version kept outside the state store (slots and
// single-file records in state_dir/pods, problems in state_dir/problems) are
// moved into it at start, and the old directories go.
func TestEarlierRecordsMoveIntoTheStore(t *testing.T) {
	dir := t.TempDir()
	const sbB, sbC = "bbbb", "cccc"
	old := filepath.Join(dir, "pods")
	_ = os.MkdirAll(old, 0o700)
	// Slots as the earlier version wrote them (same format, other directory).
	other := t.TempDir()
	prev, _ := newStore(other)
	_ = prev.save(&Pod{SandboxID: sbA, Restarts: 1})
	_ = prev.save(&Pod{SandboxID: sbA, Restarts: 2})
	for i := range uint64(2) {
		b, _ := os.ReadFile(prev.slot(sbA, i))
		_ = os.WriteFile(filepath.Join(old, filepath.Base(prev.slot(sbA, i))), b, 0o600)
	}
	b, _ := json.Marshal(&Pod{SandboxID: sbB, Phase: PhaseTerminating, Restarts: 3})
	_ = os.WriteFile(filepath.Join(old, sbB+".json"), b, 0o600)
	_ = os.WriteFile(filepath.Join(old, "."+sbB+".json.123.tmp"), []byte("{"), 0o600)
	_ = os.MkdirAll(filepath.Join(dir, "problems"), 0o700)
	b, _ = json.Marshal(&Pod{SandboxID: sbC, Problems: []string{"annotation x: malformed"}})
	_ = os.WriteFile(filepath.Join(dir, "problems", sbC+".json"), b, 0o600)

	st, err := newStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	pods, errs := st.load()
	got := map[string]int{}
	for _, p := range pods {
		got[p.SandboxID] = p.Restarts
	}
	if len(errs) > 0 || len(got) != 2 || got[sbA] != 2 || got[sbB] != 3 {
		t.Fatalf("loaded %v, errors %v", got, errs)
	}
	for _, d := range []string{old, filepath.Join(dir, "problems")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s left after the move: %v", d, err)
		}
	}
	all, err := ReadPods(dir)
	if err != nil || len(all) != 3 {
		t.Fatalf("ReadPods: %+v %v", all, err)
	}
	if err := st.remove(sbC); err != nil {
		t.Fatal(err)
	}
	if err := st.remove(sbA); err != nil {
		t.Fatal(err)
	}
	if all, _ := ReadPods(dir); len(all) != 1 || all[0].SandboxID != sbB {
		t.Fatalf("after removing two: %+v", all)
	}
}
