package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

const sb = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func bucket(t *testing.T, name string) (*Store, *Bucket) {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Bucket(name)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

func TestPutGetListRemove(t *testing.T) {
	_, b := bucket(t, "podmgmt")
	if err := b.PutJSON(sb, map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Put("other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var got map[string]int
	if err := b.GetJSON(sb, &got); err != nil || got["n"] != 1 {
		t.Fatalf("got %v, %v", got, err)
	}
	keys, err := b.List()
	if err != nil || !slices.Equal(keys, []string{sb, "other"}) {
		t.Fatalf("list %v, %v", keys, err)
	}
	if err := b.Remove(sb); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(sb); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if _, err := b.Get(sb); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("get after remove: %v", err)
	}
}

func TestFilesAre0600InDirs0700(t *testing.T) {
	s, b := bucket(t, "warm")
	if err := b.Put(sb, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{s.Root(): 0o700, b.dir: 0o700, filepath.Join(b.dir, sb): 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}

// A temporary file may be a write in flight: List skips it and leaves it;
// Open, at start, removes what a crash left.
func TestCrashLeftoversAreRemovedAtOpen(t *testing.T) {
	s, b := bucket(t, "warm")
	if err := b.Put(sb, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	// What a crash between statefile's create and rename leaves behind, and
	// a name that is not a key (left alone, not listed).
	for _, n := range []string{"." + sb + ".123456" + statefile.TempSuffix, ".x.9" + statefile.TempSuffix, "not.a.key"} {
		if err := os.WriteFile(filepath.Join(b.dir, n), []byte("torn"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := b.List()
	if err != nil || !slices.Equal(keys, []string{sb}) {
		t.Fatalf("list %v, %v", keys, err)
	}
	if ents, _ := os.ReadDir(b.dir); len(ents) != 4 {
		t.Fatalf("List removed files: %d left of 4", len(ents))
	}
	if _, err := Open(s.Root()); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(b.dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{sb, "not.a.key"}) {
		t.Fatalf("left in the bucket: %v", names)
	}
	if got, _ := b.Get(sb); string(got) != "kept" {
		t.Fatalf("record %q", got)
	}
}

func TestHostileKeysAreRefused(t *testing.T) {
	_, b := bucket(t, "podmgmt")
	for _, k := range []string{"", ".", "..", "../x", "a/b", `a\b`, ".hidden", "a\x00b", "a.b", strings.Repeat("a", MaxKeyLen+1)} {
		if err := b.Put(k, []byte("x")); !errors.Is(err, ErrBadKey) {
			t.Errorf("Put(%q): %v, want ErrBadKey", k, err)
		}
		if _, err := b.Get(k); !errors.Is(err, ErrBadKey) {
			t.Errorf("Get(%q): %v, want ErrBadKey", k, err)
		}
		if err := b.Remove(k); !errors.Is(err, ErrBadKey) {
			t.Errorf("Remove(%q): %v, want ErrBadKey", k, err)
		}
	}
	s, _ := bucket(t, "x")
	if _, err := s.Bucket("../escape"); !errors.Is(err, ErrBadKey) {
		t.Fatalf("bucket ../escape: %v", err)
	}
}

func TestFailedPutIsNotDurable(t *testing.T) {
	_, b := bucket(t, "podmgmt")
	if err := os.RemoveAll(b.dir); err != nil {
		t.Fatal(err)
	}
	err := b.Put(sb, []byte("x"))
	if !errors.Is(err, statefile.ErrNotDurable) {
		t.Fatalf("put into a missing bucket: %v, want ErrNotDurable", err)
	}
	if err := os.Mkdir(b.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(sb, []byte("x")); err != nil { // back to healthy for other tests
		t.Fatal(err)
	}
}

// FuzzCheckKey: a key CheckKey accepts names exactly one file directly in
// its bucket, and a Put/Get/Remove of it stays there.
func FuzzCheckKey(f *testing.F) {
	for _, k := range []string{sb, "sb", "", ".", "..", "../etc/passwd", "a/b", ".x.tmp", "a\x00", strings.Repeat("f", 200), "é"} {
		f.Add(k)
	}
	dir := f.TempDir()
	b := &Bucket{dir: dir}
	f.Fuzz(func(t *testing.T, key string) {
		if CheckKey(key) != nil {
			if err := b.Put(key, []byte("x")); !errors.Is(err, ErrBadKey) {
				t.Fatalf("Put(%q) of a refused key: %v", key, err)
			}
			return
		}
		if !filepath.IsLocal(key) || filepath.Base(key) != key || strings.ContainsAny(key, "/\\.\x00") || len(key) > MaxKeyLen {
			t.Fatalf("accepted %q", key)
		}
		if err := b.Put(key, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, key)); err != nil {
			t.Fatalf("%q not in the bucket: %v", key, err)
		}
		if err := b.Remove(key); err != nil {
			t.Fatal(err)
		}
	})
}

// A List (the pod table's relist asks every bucket for its keys) during a
// write leaves the write's temporary file alone: the write succeeds.
func TestListDuringWrites(t *testing.T) {
	_, b := bucket(t, "podmgmt")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			if _, err := b.List(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		if err := b.Put(sb, []byte{byte(i)}); err != nil {
			t.Fatalf("write %d during lists: %v", i, err)
		}
	}
}
