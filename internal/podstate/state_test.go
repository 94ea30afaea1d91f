package podstate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sbA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

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

func TestStoreAlternatesSlotsNewestWins(t *testing.T) {
	dir := t.TempDir()
	st, _ := newStore(dir)
	for i := 1; i <= 5; i++ {
		if err := st.save(&Pod{SandboxID: sbA, Restarts: i, Name: strings.Repeat("x", 50-i*8)}); err != nil {
			t.Fatal(err)
		}
	}
	// Slot 1 holds saves 1, 3, 5 and slot 0 saves 2, 4; the records shrink, so
	// each slot carries a stale tail past its length.
	p, errs := loadOne(t, dir)
	if len(errs) > 0 || p == nil || p.Restarts != 5 {
		t.Fatalf("loaded %+v, errors %v", p, errs)
	}
	// A restarted store continues the sequence: the next save replaces the older slot.
	st2, _ := newStore(dir)
	if _, errs := st2.load(); len(errs) > 0 {
		t.Fatal(errs)
	}
	if err := st2.save(&Pod{SandboxID: sbA, Restarts: 6}); err != nil {
		t.Fatal(err)
	}
	if p, _ := loadOne(t, dir); p.Restarts != 6 {
		t.Fatalf("after a reload and a save: restarts %d", p.Restarts)
	}
}

// A kill -9 mid-write tears the slot being written; the state before it is read.
func TestStoreTornWriteKeepsPreviousState(t *testing.T) {
	for _, tear := range []struct {
		name string
		do   func(b []byte) []byte
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }},
		{"header only", func(b []byte) []byte { return b[:strings.IndexByte(string(b), '\n')+1] }},
		{"body flipped", func(b []byte) []byte { b[len(b)-2] ^= 0x20; return b }},
		{"empty", func([]byte) []byte { return nil }},
		{"garbage header", func(b []byte) []byte { return append([]byte("cri-shim-pod 1 x y z\n"), b...) }},
	} {
		t.Run(tear.name, func(t *testing.T) {
			dir := t.TempDir()
			st, _ := newStore(dir)
			_ = st.save(&Pod{SandboxID: sbA, Restarts: 1})
			_ = st.save(&Pod{SandboxID: sbA, Restarts: 2}) // slot 0
			f := st.slot(sbA, 2)
			b, _ := os.ReadFile(f)
			if err := os.WriteFile(f, tear.do(b), 0o600); err != nil {
				t.Fatal(err)
			}
			p, _ := loadOne(t, dir)
			if p == nil || p.Restarts != 1 {
				t.Fatalf("after a torn newest slot: %+v; want the previous state (restarts 1)", p)
			}
		})
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

// State written by earlier versions (<sandbox>.json) is read, and replaced by
// slots at the first save.
func TestStoreReadsLegacyJSON(t *testing.T) {
	dir := t.TempDir()
	b, _ := json.Marshal(&Pod{SandboxID: sbA, Phase: PhaseTerminating, Restarts: 3})
	_ = os.MkdirAll(filepath.Join(dir, "pods"), 0o700)
	if err := os.WriteFile(filepath.Join(dir, "pods", sbA+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	pods, err := ReadPods(dir)
	if err != nil || len(pods) != 1 || pods[0].Phase != PhaseTerminating {
		t.Fatalf("ReadPods: %+v %v", pods, err)
	}
	st, _ := newStore(dir)
	loaded, errs := st.load()
	if len(errs) > 0 || len(loaded) != 1 || loaded[0].Restarts != 3 {
		t.Fatalf("load: %+v %v", loaded, errs)
	}
	loaded[0].Restarts = 4
	if err := st.save(loaded[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pods", sbA+".json")); !os.IsNotExist(err) {
		t.Fatalf("legacy file kept after the first save: %v", err)
	}
	if p, _ := loadOne(t, dir); p.Restarts != 4 {
		t.Fatalf("restarts %d", p.Restarts)
	}
	if err := st.remove(sbA); err != nil {
		t.Fatal(err)
	}
	if ids, _ := sandboxes(filepath.Join(dir, "pods")); len(ids) != 0 {
		t.Fatalf("left after remove: %v", ids)
	}
}

func FuzzDecodeSlot(f *testing.F) {
	dir := f.TempDir()
	st, _ := newStore(dir)
	_ = st.save(&Pod{SandboxID: sbA, Restarts: 7, Rules: Rules{}})
	b, _ := os.ReadFile(st.slot(sbA, 1))
	f.Add(b)
	f.Add([]byte("cri-shim-pod 1 1 0 00000000\n"))
	f.Add([]byte("cri-shim-pod 1 18446744073709551615 4294967295 ffffffff\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, body, err := decodeSlot(b)
		if err != nil {
			return
		}
		if seq == 0 || len(body) > len(b) {
			t.Fatalf("accepted seq %d body %d of %d bytes", seq, len(body), len(b))
		}
		var p Pod
		_ = json.Unmarshal(body, &p) // must not panic whatever the body
	})
}
