package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

const magic = "test-slots 1"

func slots(t testing.TB) (*Store, *Slots) {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Slots("pods", magic)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

func mustGet(t *testing.T, b *Slots, key string) string {
	t.Helper()
	v, err := b.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

func TestSlotsAlternateAndTheNewestWins(t *testing.T) {
	s, b := slots(t)
	for _, v := range []string{"one-longest", "two-long", "three", "four", "five"} {
		if err := b.Put(sb, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// Slot 1 holds puts 1, 3, 5 and slot 0 puts 2, 4; records shrink, so
	// each slot carries a stale tail past its length.
	if got := mustGet(t, b, sb); got != "five" {
		t.Fatalf("got %q, want the newest", got)
	}
	// A bucket opened again continues the sequence once it has read the
	// key: the next put replaces the older slot, not the newest.
	b2, _ := s.Slots("pods", magic)
	if got := mustGet(t, b2, sb); got != "five" {
		t.Fatalf("reopened: %q", got)
	}
	if err := b2.Put(sb, []byte("six")); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, ReadSlots(s.Root(), "pods", magic), sb); got != "six" {
		t.Fatalf("after a reopen and a put: %q", got)
	}
}

// A kill -9 mid-write tears the slot being written; the record before it is read.
func TestSlotsTornWriteKeepsThePreviousRecord(t *testing.T) {
	for _, tear := range []struct {
		name string
		do   func(b []byte) []byte
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }},
		{"header only", func(b []byte) []byte { return b[:strings.IndexByte(string(b), '\n')+1] }},
		{"body flipped", func(b []byte) []byte { b[len(b)-2] ^= 0x20; return b }},
		{"empty", func([]byte) []byte { return nil }},
		{"garbage header", func(b []byte) []byte { return append([]byte(magic+" x y z\n"), b...) }},
		{"other format", func(b []byte) []byte { return []byte(strings.Replace(string(b), magic, "test-slots 2", 1)) }},
	} {
		t.Run(tear.name, func(t *testing.T) {
			_, b := slots(t)
			_ = b.Put(sb, []byte("first"))
			_ = b.Put(sb, []byte("second")) // slot 0
			f := b.Path(sb, 2)
			raw, _ := os.ReadFile(f)
			if err := os.WriteFile(f, tear.do(raw), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := mustGet(t, b, sb); got != "first" {
				t.Fatalf("after a torn newest slot: %q; want the previous record", got)
			}
		})
	}
}

func TestSlotsAllTornIsAnErrorMissingIsNotExist(t *testing.T) {
	_, b := slots(t)
	_ = b.Put(sb, []byte("a"))
	_ = b.Put(sb, []byte("b"))
	for i := range uint64(2) {
		_ = os.WriteFile(b.Path(sb, i), []byte("junk"), 0o600)
	}
	if _, err := b.Get(sb); err == nil || !strings.Contains(err.Error(), "no header line") || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("two torn slots: %v", err)
	}
	if _, err := b.Get("absent"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a key never put: %v", err)
	}
}

func TestSlotsListRemoveAndModes(t *testing.T) {
	_, b := slots(t)
	_ = b.Put(sb, []byte("a"))
	_ = b.Put(sb, []byte("b"))
	_ = b.Put("other", []byte("c"))
	_ = os.WriteFile(filepath.Join(b.Dir(), ".x.123.tmp"), nil, 0o600)
	_ = os.WriteFile(filepath.Join(b.Dir(), "bad.name.0"), nil, 0o600)
	keys, err := b.List()
	if err != nil || !slices.Equal(keys, []string{sb, "other"}) {
		t.Fatalf("List = %v, %v", keys, err)
	}
	for _, f := range []string{b.Path(sb, 0), b.Path(sb, 1)} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	if err := b.Remove(sb); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(sb); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if keys, _ := b.List(); !slices.Equal(keys, []string{"other"}) {
		t.Fatalf("after remove: %v", keys)
	}
	if err := b.Put("../x", nil); !errors.Is(err, ErrBadKey) {
		t.Fatalf("hostile key: %v", err)
	}
}

// The lifecycle covers slot buckets: Known lists their keys, Gone removes
// their slots.
func TestGoneRemovesSlots(t *testing.T) {
	s, b := slots(t)
	_ = b.Put(sb, []byte("a"))
	_ = b.Put(sb, []byte("b"))
	if known, err := s.Known(); err != nil || !known[sb] {
		t.Fatalf("Known = %v, %v", known, err)
	}
	if err := s.Gone(sb); err != nil {
		t.Fatal(err)
	}
	for i := range uint64(2) {
		if _, err := os.Stat(b.Path(sb, i)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("slot %d after Gone: %v", i, err)
		}
	}
}

func TestSlotsFailedPutIsNotDurableAndKeepsTheRecord(t *testing.T) {
	_, b := slots(t)
	_ = b.Put(sb, []byte("kept"))
	b.Write = func(string, []byte) error { return syscall.ENOSPC }
	err := b.Put(sb, []byte("lost"))
	if !errors.Is(err, statefile.ErrNotDurable) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("failed put: %v", err)
	}
	b.Write = nil
	if got := mustGet(t, b, sb); got != "kept" {
		t.Fatalf("after a failed put: %q", got)
	}
	// The failed put used no sequence number: the next one goes to the
	// slot after the kept record's, leaving the kept record intact until
	// it is durable.
	if err := b.Put(sb, []byte("next")); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, b, sb); got != "next" {
		t.Fatalf("after a put: %q", got)
	}
}

func FuzzDecodeSlot(f *testing.F) {
	_, b := slots(f)
	_ = b.Put(sb, []byte(`{"restarts":7}`))
	raw, _ := os.ReadFile(b.Path(sb, 1))
	f.Add(raw)
	f.Add([]byte(magic + " 1 0 00000000\n"))
	f.Add([]byte(magic + " 18446744073709551615 4294967295 ffffffff\n{}"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		seq, body, err := DecodeSlot(magic, raw)
		if err != nil {
			return
		}
		if seq == 0 || len(body) > len(raw) || !strings.HasPrefix(string(raw), magic+" ") {
			t.Fatalf("accepted seq %d body %d of %d bytes", seq, len(body), len(raw))
		}
	})
}
