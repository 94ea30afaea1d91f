package restoremark

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// fixture is a mark directory and a staged restore, both the test's own.
func fixture(t *testing.T) (Dir, Mark) {
	t.Helper()
	root := t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.Mkdir(images, 0o700); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(root, "rootfs-diff.tar")
	if err := os.WriteFile(diff, []byte("tar"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Dir{Path: filepath.Join(root, "marks"), Owner: os.Getuid()}, Mark{Images: images, RootfsDiff: diff, RootfsDiffMaxBytes: 1 << 30}
}

func TestWriteClaimRemove(t *testing.T) {
	d, m := fixture(t)
	if got, err := d.Claim(id); got != nil || err != nil {
		t.Fatalf("claim before any mark: %v, %v", got, err)
	}
	if err := d.Write(id, m); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(id, m); err == nil {
		t.Fatal("a second mark for the same container was written")
	}
	fi, err := os.Stat(filepath.Join(d.Path, id))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mark file: %v %v", fi, err)
	}
	if d.Claimed(id) {
		t.Fatal("claimed before the runtime shim claimed it")
	}
	got, err := d.Claim(id)
	if err != nil || got == nil || *got != m {
		t.Fatalf("claim: %+v, %v", got, err)
	}
	if !d.Claimed(id) {
		t.Fatal("not claimed after the claim")
	}
	if again, err := d.Claim(id); again != nil || err != nil {
		t.Fatalf("a mark was claimed twice: %v %v", again, err)
	}
	l, err := d.List()
	if err != nil || len(l) != 1 || l[0].ID != id || !l[0].Claimed || l[0].Mark == nil || *l[0].Mark != m {
		t.Fatalf("list: %+v %v", l, err)
	}
	if err := d.Remove(id); err != nil {
		t.Fatal(err)
	}
	if l, _ := d.List(); len(l) != 0 {
		t.Fatalf("left after remove: %+v", l)
	}
}

// A mark that is there but cannot be trusted fails the claim: the container
// must not start fresh in place of its restore.
func TestClaimRefusesUntrustedMarks(t *testing.T) {
	cases := map[string]func(t *testing.T, d Dir, m Mark){
		"mark writable by others": func(t *testing.T, d Dir, m Mark) {
			must(t, d.Write(id, m))
			must(t, os.Chmod(filepath.Join(d.Path, id), 0o666))
		},
		"mark directory writable by others": func(t *testing.T, d Dir, m Mark) {
			must(t, d.Write(id, m))
			must(t, os.Chmod(d.Path, 0o777))
		},
		"mark is a symlink": func(t *testing.T, d Dir, m Mark) {
			must(t, os.Mkdir(d.Path, 0o700))
			other := filepath.Join(filepath.Dir(d.Path), "other")
			must(t, os.WriteFile(other, []byte(`{"images":"`+m.Images+`"}`), 0o600))
			must(t, os.Symlink(other, filepath.Join(d.Path, id)))
		},
		"images path relative": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"images"}`)
		},
		"images path not clean": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`/../images"}`)
		},
		"images a symlink": func(t *testing.T, d Dir, m Mark) {
			link := m.Images + "-link"
			must(t, os.Symlink(m.Images, link))
			writeRaw(t, d, `{"images":"`+link+`"}`)
		},
		"images writable by others": func(t *testing.T, d Dir, m Mark) {
			must(t, os.Chmod(m.Images, 0o777))
			writeRaw(t, d, `{"images":"`+m.Images+`"}`)
		},
		"diff a directory": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`","rootfsDiff":"`+m.Images+`"}`)
		},
		"diff bound negative": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`","rootfsDiff":"`+m.RootfsDiff+`","rootfsDiffMaxBytes":-1}`)
		},
		"diff bound not an integer": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`","rootfsDiff":"`+m.RootfsDiff+`","rootfsDiffMaxBytes":1.5}`)
		},
		"unknown field": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`","spec":"x"}`)
		},
		"trailing data": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`"}{}`)
		},
		"too large": func(t *testing.T, d Dir, m Mark) {
			writeRaw(t, d, `{"images":"`+m.Images+`"}`+strings.Repeat(" ", maxMarkSize))
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			d, m := fixture(t)
			setup(t, d, m)
			got, err := d.Claim(id)
			if err == nil || got != nil {
				t.Fatalf("claimed: %+v, %v", got, err)
			}
			if d.Claimed(id) {
				t.Fatal("an untrusted mark was renamed claimed")
			}
		})
	}
}

func TestWriteRefusesBadInput(t *testing.T) {
	d, m := fixture(t)
	if err := d.Write("../x", m); err == nil {
		t.Fatal("an ID with a path was accepted")
	}
	if err := d.Write(id, Mark{Images: "relative"}); err == nil {
		t.Fatal("a relative images path was accepted")
	}
	if got, err := d.Claim("../../etc/passwd"); got != nil || err != nil {
		t.Fatalf("claim of a non-ID: %v %v", got, err)
	}
	if err := d.Write(id, Mark{Images: m.Images, RootfsDiff: m.RootfsDiff, RootfsDiffMaxBytes: -1}); err == nil {
		t.Fatal("a negative diff bound was accepted")
	}
}

// The diff bound a mark carries is read back as written; none, or one
// above the fixed bound, is the fixed bound.
func TestRootfsDiffLimit(t *testing.T) {
	d, m := fixture(t)
	m.RootfsDiffMaxBytes = 12345
	must(t, d.Write(id, m))
	got, err := d.Claim(id)
	if err != nil || got.RootfsDiffMaxBytes != 12345 || RootfsDiffLimit(got.RootfsDiffMaxBytes) != 12345 {
		t.Fatalf("claimed %+v, %v", got, err)
	}
	for n, want := range map[int64]int64{0: MaxRootfsDiffBytes, -1: MaxRootfsDiffBytes, MaxRootfsDiffBytes + 1: MaxRootfsDiffBytes, 1 << 62: MaxRootfsDiffBytes, MaxRootfsDiffBytes: MaxRootfsDiffBytes, 1: 1} {
		if got := RootfsDiffLimit(n); got != want {
			t.Errorf("RootfsDiffLimit(%d) = %d, want %d", n, got, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"images":"/a","rootfsDiff":"/b"}`))
	f.Add([]byte(`{"images":"/a","rootfsDiff":"/b","rootfsDiffMaxBytes":17179869184}`))
	f.Add([]byte(`{"images":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(strings.NewReader(string(b)))
		if err == nil && m == nil {
			t.Fatal("nil mark without an error")
		}
		if len(b) > maxMarkSize && err == nil {
			t.Fatal("an oversized mark was decoded")
		}
	})
}

func writeRaw(t *testing.T, d Dir, s string) {
	t.Helper()
	must(t, os.MkdirAll(d.Path, 0o700))
	must(t, os.WriteFile(filepath.Join(d.Path, id), []byte(s), 0o600))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
