package ociartifact

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// withinAlloc runs f and fails t when it allocated more than bound bytes in
// all: a parser of registry data must not grow with what the data claims.
func withinAlloc(t *testing.T, bound int64, f func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	if d := int64(after.TotalAlloc - before.TotalAlloc); d > bound {
		t.Fatalf("allocated %d bytes (bound %d)", d, bound)
	}
}

// Archives come from a registry: any bytes either fail or every member is a
// regular file or directory at a local path under a member criu writes.
func FuzzCheckArchive(f *testing.F) {
	f.Add(tarBytes(f, goodMembers(64)))
	f.Add(tarBytes(f, append(goodMembers(8), member{"../x", tar.TypeReg, []byte("x")})))
	f.Add(tarBytes(f, append(goodMembers(8), member{"checkpoint/l", tar.TypeSymlink, nil})))
	f.Add(tarBytes(f, append(goodMembers(8), member{"/abs", tar.TypeReg, nil})))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var err error
		withinAlloc(t, 64<<20, func() { err = checkArchive(bytes.NewReader(b)) })
		if err != nil {
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
		withinAlloc(t, 64<<20+64*int64(len(b)), func() { _, _ = parseIndex(b) })
		if p, err := parseIndex(b); err == nil {
			seen := map[string]bool{}
			for _, c := range p.containers {
				if layout.CheckContainerName(c.name) != nil || seen[c.name] {
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

// A pod names the reference: whatever it is, an accepted one pins a sha256
// digest, spells out an allow-listed registry and has a clean repository.
func FuzzParseRestoreRef(f *testing.F) {
	for _, s := range []string{"127.0.0.1:5000/cp/web@" + zeroDigest, "reg.example/a/b:v1@" + zeroDigest,
		"evil.example/x@" + zeroDigest, "127.0.0.1:5000/../x@" + zeroDigest, "busybox", "127.0.0.1:5000/x:v1", "a/b@sha256:zz"} {
		f.Add(s)
	}
	allow := []Allowed{{Host: "127.0.0.1:5000", Namespaces: everyNS, PlainHTTP: true}, {Host: "reg.example", Namespaces: everyNS}}
	f.Fuzz(func(t *testing.T, s string) {
		d, a, err := ParseRestoreRef(s, "default", allow)
		if err != nil {
			return
		}
		if a.Host != "127.0.0.1:5000" && a.Host != "reg.example" {
			t.Fatalf("%q accepted for registry %q", s, a.Host)
		}
		if !strings.EqualFold(d.Context().RegistryStr(), a.Host) || !strings.HasPrefix(s, d.Context().RegistryStr()+"/") && !strings.HasPrefix(strings.ToLower(s), strings.ToLower(a.Host)+"/") {
			t.Fatalf("%q accepted as %s of %s", s, d, a.Host)
		}
		hex, ok := strings.CutPrefix(d.DigestStr(), "sha256:")
		if !ok || len(hex) != 64 || layout.CheckName(layout.PulledDir(hex)) != nil {
			t.Fatalf("%q accepted with digest %q", s, d.DigestStr())
		}
		for _, c := range strings.Split(d.Context().RepositoryStr(), "/") {
			if c == "" || c == "." || c == ".." {
				t.Fatalf("%q accepted with repository %q", s, d.Context().RepositoryStr())
			}
		}
	})
}

// A namespace's secret is hostile: any bytes either fail or give
// credentials keyed by a registry host, never a credential helper.
func FuzzParseDockerConfigJSON(f *testing.F) {
	f.Add([]byte(`{"auths":{"https://index.docker.io/v1/":{"auth":"dTpw"},"127.0.0.1:5000":{"username":"u","password":"p"}}}`))
	f.Add([]byte(`{"auths":{"":{}},"credsStore":"x","credHelpers":{"a":"b"}}`))
	f.Add([]byte(`{"auths":{"h/../x":{"username":"u"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseDockerConfigJSON(b)
		if err != nil {
			return
		}
		for k := range m {
			if k == "" || strings.ContainsAny(k, "/@ ") || RegistryKey(k) != k {
				t.Fatalf("credentials keyed %q", k)
			}
		}
	})
}

// A namespace names where an export pushes: an accepted one names an
// allow-listed registry, a tag and no digest.
func FuzzParseExportRef(f *testing.F) {
	for _, s := range []string{"127.0.0.1:5000/cp/web:v1", "127.0.0.1:5000/cp/web", "evil.example/x:v1", "127.0.0.1:5000/x@" + zeroDigest, "a/b:c"} {
		f.Add(s)
	}
	allow := []Allowed{{Host: "127.0.0.1:5000", Namespaces: everyNS, PlainHTTP: true}}
	f.Fuzz(func(t *testing.T, s string) {
		tag, a, err := ParseExportRef(s, "default", allow)
		if err != nil {
			return
		}
		if a.Host != "127.0.0.1:5000" || tag.Context().RegistryStr() != a.Host || tag.TagStr() == "" || strings.Contains(s, "@") {
			t.Fatalf("%q accepted as %s for %q", s, tag, a.Host)
		}
	})
}

// An access record is read back from the checkpoint root: any bytes either
// fail or give a record whose every lookup and addition works.
func FuzzParseAccess(f *testing.F) {
	r := newAccessRecord()
	r.add("h/r", podCredential{raw: []byte("c")})
	r.add("h/s", podCredential{})
	b, _ := json.Marshal(r)
	f.Add(b)
	f.Add([]byte(`{"salt":"` + strings.Repeat("0", 64) + `","repositories":{"h/r":{"credentials":[]}}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseAccess(b)
		if err != nil {
			return
		}
		c := podCredential{raw: b}
		for repo := range r.Repos {
			r.allows(repo, c)
			r.add(repo, c)
			if !r.allows(repo, c) {
				t.Fatalf("%s: not allowed after it was added", repo)
			}
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseAccess(again); err != nil {
			t.Fatalf("a parsed record does not parse again: %v", err)
		}
	})
}
