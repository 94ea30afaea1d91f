package ociartifact

import (
	"archive/tar"
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/criu"
)

// Archives come from a registry: any bytes either fail or every member is a
// regular file or directory at a local path under a member criu writes.
func FuzzCheckArchive(f *testing.F) {
	f.Add(tarBytes(f, goodMembers(64)))
	f.Add(tarBytes(f, append(goodMembers(8), member{"../x", tar.TypeReg, []byte("x")})))
	f.Add(tarBytes(f, append(goodMembers(8), member{"checkpoint/l", tar.TypeSymlink, nil})))
	f.Add(tarBytes(f, append(goodMembers(8), member{"/abs", tar.TypeReg, nil})))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkArchive(bytes.NewReader(b)) != nil {
			return
		}
		tr := tar.NewReader(bytes.NewReader(b))
		for {
			h, err := tr.Next()
			if err != nil {
				return
			}
			name := strings.TrimSuffix(h.Name, "/")
			if !filepath.IsLocal(name) || (h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeDir) {
				t.Fatalf("accepted member %q of type %q", h.Name, h.Typeflag)
			}
		}
	})
}

// Indexes and manifests come from a registry: any bytes either fail or name
// containers that are DNS-1123 labels, once each, with sha256 digests and
// capped sizes, and no foreign URLs.
func FuzzParseIndex(f *testing.F) {
	b, err := Build(twoContainers(f, f.TempDir(), "src"), nil)
	if err != nil {
		f.Fatal(err)
	}
	raw, _ := b.Index.RawManifest()
	f.Add(raw)
	for _, img := range b.Index.(*rawIndex).images {
		m, _ := img.RawManifest()
		f.Add(m)
	}
	f.Add([]byte(strings.Replace(string(raw), `"container":"app"`, `"container":"../x"`, 1)))
	f.Add([]byte(`{"schemaVersion":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := parseIndex(b); err == nil {
			seen := map[string]bool{}
			for _, c := range p.containers {
				if criu.CheckContainerName(c.name) != nil || seen[c.name] {
					t.Fatalf("accepted container %q", c.name)
				}
				seen[c.name] = true
				if len(c.desc.URLs) > 0 || c.desc.Size > maxImageManifest || c.desc.Digest.Algorithm != "sha256" {
					t.Fatalf("accepted descriptor %+v", c.desc)
				}
			}
		}
		if _, sb, err := parsePodArtifact(b); err == nil && sb.Size > maxSandboxBytes {
			t.Fatalf("accepted sandbox.json of %d bytes", sb.Size)
		}
		if _, ar, err := parseContainerManifest(b, "app"); err == nil && (len(ar.URLs) > 0 || ar.Size <= 0) {
			t.Fatalf("accepted archive %+v", ar)
		}
	})
}
