package layout

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Manifests come from disk and are not trusted: any input either fails with
// an error or yields a manifest whose names are container names (DNS-1123
// labels) and whose archive names stay inside the checkpoint.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"a","archive":"containers/a.tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"../x","archive":"containers/../x.tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"../../x","archive":"containers/../../x.tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"..","archive":"containers/...tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"/etc/x","archive":"containers//etc/x.tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"a/../../b","archive":"containers/a/../../b.tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"a\u0000","archive":"containers/a\u0000.tar"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"a","archive":"containers/a.tar"}],"exited":[{"name":"../../etc"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"a","archive":"containers/a.tar"}],"exited":[{"name":"x/y"}]}`))
	f.Add([]byte(`{"formatVersion":1,"containers":[{"name":"A.b","archive":"containers/A.b.tar"}]}`))
	f.Add([]byte(`{"formatVersion":2}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m *Manifest
		var err error
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m, err = ParseManifest(b)
		runtime.ReadMemStats(&after)
		// A manifest is parsed from at most maxManifestBytes: what it
		// allocates is bounded by its size, whatever it claims.
		if d := after.TotalAlloc - before.TotalAlloc; d > 16<<20+64*uint64(len(b)) {
			t.Fatalf("ParseManifest of %d bytes allocated %d", len(b), d)
		}
		if err != nil {
			return
		}
		for _, c := range m.Containers {
			if c.Archive != ArchiveName(c.Name) {
				t.Fatalf("accepted archive %q for %q", c.Archive, c.Name)
			}
			if CheckContainerName(c.Name) != nil {
				t.Fatalf("accepted container name %q", c.Name)
			}
			if !filepath.IsLocal(c.Archive) || filepath.Clean(c.Archive) != c.Archive || filepath.Dir(c.Archive) != ContainersDir {
				t.Fatalf("name %q gives archive %q, not one element under %s/", c.Name, c.Archive, ContainersDir)
			}
		}
		for _, x := range m.Exited {
			if CheckContainerName(x.Name) != nil {
				t.Fatalf("accepted exited container name %q", x.Name)
			}
		}
	})
}

// confine never accepts a path that resolves outside the root, whatever the input.
func FuzzConfine(f *testing.F) {
	root := f.TempDir()
	os.MkdirAll(filepath.Join(root, "in", "deep"), 0o700)
	os.Symlink("/", filepath.Join(root, "up"))
	os.Symlink("in", filepath.Join(root, "rel"))
	for _, s := range []string{"in", "in/deep", "up", "up/etc", "../x", "rel/deep", "", "in/../..", "/etc", "in//deep/."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := s
		if !strings.HasPrefix(s, "/") {
			p = filepath.Join(root, s)
			if strings.Contains(s, "..") {
				p = root + "/" + s // keep the dot-dots for Confine to see
			}
		}
		got, err := Confine(root, p)
		if err != nil {
			return
		}
		real, _ := filepath.EvalSymlinks(root)
		if !Within(real, got) {
			t.Fatalf("Confine(%q) = %q, outside %q", p, got, real)
		}
	})
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"ok", "..", ".", "a/b", "a\x00", strings.Repeat("a", 300), "-x", "x.y_z-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if CheckName(s) != nil {
			return
		}
		if !filepath.IsLocal(s) || strings.ContainsAny(s, "/\x00") || s != filepath.Base(s) {
			t.Fatalf("accepted %q", s)
		}
	})
}
