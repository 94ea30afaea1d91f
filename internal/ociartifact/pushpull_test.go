package ociartifact

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// A pushed checkpoint pulled back under another name is the same files,
// byte for byte, and a checkpoint criu reads.
func TestPushPullRoundTripIsByteIdentical(t *testing.T) {
	r := newTestRegistry(t)
	root := t.TempDir()
	src := twoContainers(t, root, "src")
	p, err := Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
	must(t, err)
	if !strings.HasPrefix(p.Ref, r.host+"/cp/web@sha256:") {
		t.Fatalf("pushed ref %q", p.Ref)
	}
	got, err := Pull(context.Background(), r.ref("cp/web:v1"), r.reg(), PullOptions{Root: root, Name: "copy"})
	must(t, err)
	if got.Digest != p.Digest || got.Dir != filepath.Join(root, "copy") {
		t.Fatalf("pulled %s into %s, pushed %s", got.Digest, got.Dir, p.Digest)
	}
	for _, rel := range []string{layout.ManifestFile, layout.SandboxFile, layout.ArchiveName("app"), layout.ArchiveName("sidecar")} {
		a, err := os.ReadFile(filepath.Join(src, rel))
		must(t, err)
		b, err := os.ReadFile(filepath.Join(got.Dir, rel))
		must(t, err)
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs after the round trip (%d bytes, pulled %d)", rel, len(a), len(b))
		}
	}
	ents, _ := os.ReadDir(got.Dir)
	if len(ents) != 3 {
		t.Errorf("pulled directory holds %d entries, want manifest.json, sandbox.json, containers/", len(ents))
	}
	if _, err := layout.ReadManifest(got.Dir); err != nil {
		t.Fatal(err)
	}
	// Pulled by digest too.
	if _, err := Pull(context.Background(), p.Ref, r.reg(), PullOptions{Root: root, Name: "by-digest"}); err != nil {
		t.Fatal(err)
	}
}

// Content the registry holds is not uploaded again: a second push of the
// same checkpoint sends no blob and no manifest, and a push of it under
// another tag sends only the tag's manifest.
func TestSecondPushUploadsNothing(t *testing.T) {
	r := newTestRegistry(t)
	src := twoContainers(t, t.TempDir(), "src")
	_, err := Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
	must(t, err)
	if blobs, manifests := r.tr.reset(); blobs == 0 || manifests != 4 {
		t.Fatalf("first push: %d blob requests, %d manifest PUTs; want some, and 4 (index, pod, 2 containers)", blobs, manifests)
	}
	_, err = Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
	must(t, err)
	if blobs, manifests := r.tr.reset(); blobs != 0 || manifests != 0 {
		t.Errorf("second push: %d blob requests, %d manifest PUTs; want 0", blobs, manifests)
	}
	_, err = Push(context.Background(), src, r.ref("cp/web:v2"), r.reg(), nil)
	must(t, err)
	if blobs, manifests := r.tr.reset(); blobs != 0 || manifests != 1 {
		t.Errorf("push under a new tag: %d blob requests, %d manifest PUTs; want 0 and 1", blobs, manifests)
	}
}

// A blob or manifest that does not match its digest, or a manifest larger
// than any of a checkpoint, is refused, and nothing is left under the root.
func TestTamperedContentIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match func(path string, body []byte) bool
	}{
		{"archive", func(p string, b []byte) bool { return strings.Contains(p, "/blobs/") && len(b) > 200<<10 }},
		{"manifest.json", func(p string, b []byte) bool {
			return strings.Contains(p, "/blobs/") && bytes.Contains(b, []byte(`"formatVersion"`))
		}},
		{"container manifest", func(p string, b []byte) bool {
			return strings.Contains(p, "/manifests/sha256:") && bytes.Contains(b, []byte(AnnotationCRIUContainerName))
		}},
		{"oversized index", func(p string, b []byte) bool { return strings.Contains(p, "/manifests/v1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRegistry(t)
			root := t.TempDir()
			src := twoContainers(t, root, "src")
			_, err := Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
			must(t, err)
			hit := false
			r.tr.rewrite = func(req *http.Request, b []byte) []byte {
				if tc.match(req.URL.Path, b) {
					hit = true
					if strings.HasPrefix(tc.name, "oversized") {
						return append(bytes.Clone(b), bytes.Repeat([]byte(" "), maxIndexBytes)...)
					}
					b = bytes.Clone(b)
					b[len(b)/2] ^= 1
				}
				return b
			}
			_, err = Pull(context.Background(), r.ref("cp/web:v1"), r.reg(), PullOptions{Root: root, Name: "copy"})
			if !hit {
				t.Fatal("nothing was tampered with")
			}
			if err == nil {
				t.Fatal("tampered content was pulled")
			}
			t.Log(err)
			onlySource(t, root)
		})
	}
}

// onlySource checks that the root holds only the source checkpoint.
func onlySource(t *testing.T, root string) {
	t.Helper()
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.Name() != "src" {
			t.Errorf("left under the root: %s", e.Name())
		}
	}
}

// Archives with members criu never writes (escapes, links, devices, other
// names) are refused while they stream, nothing is left under the root.
func TestHostileArchivesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    member
	}{
		{"dot-dot", member{"../escape", '0', []byte("x")}},
		{"dot-dot inside", member{"checkpoint/../../escape", '0', []byte("x")}},
		{"absolute", member{"/etc/cron.d/x", '0', []byte("x")}},
		{"symlink", member{"checkpoint/link", '2', nil}},
		{"hard link", member{"checkpoint/hard", '1', nil}},
		{"device", member{"checkpoint/dev", '3', nil}},
		{"fifo", member{"checkpoint/fifo", '6', nil}},
		{"unknown file", member{"evil.sh", '0', []byte("x")}},
		{"directory outside checkpoint/", member{"etc/", '5', nil}},
		{"twice", member{"spec.dump", '0', []byte("{}")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRegistry(t)
			root := t.TempDir()
			src := writeCheckpoint(t, root, "src", map[string][]byte{
				"app": tarBytes(t, append(goodMembers(1024), tc.m)),
			}, "app")
			_, err := Push(context.Background(), src, r.ref("cp/bad:v1"), r.reg(), nil)
			must(t, err)
			_, err = Pull(context.Background(), r.ref("cp/bad:v1"), r.reg(), PullOptions{Root: root, Name: "copy"})
			if err == nil {
				t.Fatal("pulled")
			}
			t.Log(err)
			onlySource(t, root)
		})
	}
	// containerd pulls a base image it lacks by config.dump's name for it:
	// only an image ID, which names no registry, is accepted.
	for _, ref := range []string{"127.0.0.1:5000/x/busybox@sha256:" + strings.Repeat("a", 64), "evil.example/busybox:latest", "", "sha256:ABC"} {
		t.Run("base image "+ref, func(t *testing.T) {
			ms := goodMembers(10)
			ms[0].body = []byte(fmt.Sprintf(`{"id":"c","rootfsImageRef":%q}`, ref))
			if err := checkArchive(bytes.NewReader(tarBytes(t, ms))); err == nil || !strings.Contains(err.Error(), "not by image ID") {
				t.Fatalf("checkArchive = %v", err)
			}
		})
	}
	t.Run("config.dump too large", func(t *testing.T) {
		ms := goodMembers(10)
		ms[0].body = bytes.Repeat([]byte(" "), maxConfigDump+1)
		if err := checkArchive(bytes.NewReader(tarBytes(t, ms))); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("checkArchive = %v", err)
		}
	})
	t.Run("missing spec.dump", func(t *testing.T) {
		var ms []member
		for _, m := range goodMembers(10) {
			if m.name != "spec.dump" {
				ms = append(ms, m)
			}
		}
		if err := checkArchive(bytes.NewReader(tarBytes(t, ms))); err == nil || !strings.Contains(err.Error(), "spec.dump") {
			t.Fatalf("checkArchive = %v", err)
		}
	})
}

// Pull writes only names criu restores by, never over a checkpoint, never
// into a PodCheckpoint object's directory, and caps what it fetches.
func TestPullNameAndSizeRules(t *testing.T) {
	r := newTestRegistry(t)
	root := t.TempDir()
	src := twoContainers(t, root, "src")
	_, err := Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
	must(t, err)
	for _, tc := range []struct {
		name string
		o    PullOptions
		want string
	}{
		{"existing", PullOptions{Name: "src"}, "already exists"},
		{"object directory", PullOptions{Name: layout.ObjectDirPrefix + "1234"}, "PodCheckpoint"},
		{"path", PullOptions{Name: "../x"}, "checkpoint name"},
		{"hidden", PullOptions{Name: ".x"}, "checkpoint name"},
		{"over the cap", PullOptions{Name: "big", MaxBytes: 1000}, "cap"},
	} {
		tc.o.Root = root
		_, err := Pull(context.Background(), r.ref("cp/web:v1"), r.reg(), tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Pull = %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	onlySource(t, root)
	got, err := Pull(context.Background(), r.ref("cp/web:v1"), r.reg(), PullOptions{Root: root})
	must(t, err)
	if got.Name != "default-web-20261123T100000Z" {
		t.Errorf("default name %q", got.Name)
	}
}

// Plain HTTP is used only when asked, and only to loopback.
func TestPlainHTTPOnlyWhenAskedAndOnlyToLoopback(t *testing.T) {
	r := newTestRegistry(t)
	src := twoContainers(t, t.TempDir(), "src")
	_, err := Push(context.Background(), src, r.ref("cp/web:v1"), Registry{Transport: r.tr}, nil)
	if !errors.Is(err, errPlainHTTP) {
		t.Errorf("push over HTTP without PlainHTTP: %v", err)
	}
	if _, err := (Registry{PlainHTTP: true}).parseRef("registry.example.com/cp/web:v1"); err == nil {
		t.Error("plain HTTP accepted for a remote registry")
	}
	if _, err := (Registry{PlainHTTP: true}).parseRef("10.0.0.1:5000/cp/web:v1"); err == nil {
		t.Error("plain HTTP accepted for a private address")
	}
	for _, h := range []string{"localhost:5000", "127.0.0.1:5000", "[::1]:5000"} {
		if _, err := (Registry{PlainHTTP: true}).parseRef(h + "/cp/web:v1"); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
}

// An index that is not a cri-shim pod checkpoint this build reads, or whose
// parts disagree, is refused before anything is written.
func TestHostileIndexesAreRefused(t *testing.T) {
	b, err := Build(twoContainers(t, t.TempDir(), "src"), nil)
	must(t, err)
	good, err := b.Index.RawManifest()
	must(t, err)
	if _, err := parseIndex(good); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, old, new string }{
		{"other format", `"checkpoint.cri-shim.io/format":"pod-checkpoint"`, `"checkpoint.cri-shim.io/format":"x"`},
		{"other version", `"checkpoint.cri-shim.io/format-version":"1"`, `"checkpoint.cri-shim.io/format-version":"2"`},
		{"container name escapes", `"checkpoint.cri-shim.io/container":"app"`, `"checkpoint.cri-shim.io/container":"../../etc"`},
		{"container twice", `"checkpoint.cri-shim.io/container":"sidecar"`, `"checkpoint.cri-shim.io/container":"app"`},
		{"unknown role", `"checkpoint.cri-shim.io/role":"pod"`, `"checkpoint.cri-shim.io/role":"x"`},
		{"foreign urls", `"artifactType"`, `"urls":["http://evil.example/x"],"artifactType"`},
		{"docker media type", `"mediaType":"application/vnd.oci.image.index.v1+json"`, `"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json"`},
	} {
		raw := strings.Replace(string(good), tc.old, tc.new, 1)
		if raw == string(good) {
			t.Fatalf("%s: %q not in the index", tc.name, tc.old)
		}
		if _, err := parseIndex([]byte(raw)); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	idx, err := parseIndex(good)
	must(t, err)
	m := *b.Manifest
	m.Pod.Namespace = "other"
	if err := checkAgrees(idx, &m); err == nil {
		t.Error("an index naming another namespace than its manifest.json was accepted")
	}
	m = *b.Manifest
	m.Containers = m.Containers[:1]
	if err := checkAgrees(idx, &m); err == nil {
		t.Error("an index listing other containers than its manifest.json was accepted")
	}
}
