package ociartifact

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
)

// Where an export pushes is refused unless it spells out an allow-listed
// registry, names no digest and has a clean repository.
func TestExportRefRules(t *testing.T) {
	allow := []Allowed{{Host: "127.0.0.1:5000", Namespaces: everyNS, PlainHTTP: true}}
	for ref, kind := range map[string]error{
		"127.0.0.1:5000/cp/web:v1":                   nil,
		"127.0.0.1:5000/cp/web":                      nil,
		"127.0.0.1:5000/cp/web@" + zeroDigest:        errdefs.ErrInvalidArgument,
		"evil.example/cp/web:v1":                     errdefs.ErrPermissionDenied,
		"cp/web:v1":                                  errdefs.ErrInvalidArgument,
		"127.0.0.1:5000/cp/../web:v1":                errdefs.ErrInvalidArgument,
		"127.0.0.1:5000/" + strings.Repeat("a", 600): errdefs.ErrInvalidArgument,
	} {
		_, _, err := ParseExportRef(ref, "default", allow)
		if kind == nil && err != nil || kind != nil && !errors.Is(err, kind) {
			t.Errorf("%s: %v, want %v", ref, err, kind)
		}
	}
}

// The allow-list is by repository prefix and namespace: an export goes
// only where an entry covering its repository, component by component,
// names its namespace; the longest prefix decides.
func TestExportRefByRepositoryAndNamespace(t *testing.T) {
	allow := []Allowed{
		{Host: "reg.example/team-a", Namespaces: []string{"a"}},
		{Host: "reg.example/shared", Namespaces: everyNS},
		{Host: "reg.example/shared/ops", Namespaces: []string{"ops"}, AnonymousPush: true},
	}
	for _, tc := range []struct {
		ref, ns, entry string // entry "": refused
	}{
		{"reg.example/team-a/web:v1", "a", "reg.example/team-a"},
		{"reg.example/team-a:v1", "a", "reg.example/team-a"},
		{"reg.example/team-a/web:v1", "b", ""},
		{"reg.example/team-ab/web:v1", "a", ""},
		{"reg.example/shared/web:v1", "b", "reg.example/shared"},
		{"reg.example/shared/ops/x:v1", "ops", "reg.example/shared/ops"},
		{"reg.example/shared/ops/x:v1", "b", "reg.example/shared"},
		{"reg.example/other/x:v1", "a", ""},
		{"other.example/team-a/x:v1", "a", ""},
	} {
		_, a, err := ParseExportRef(tc.ref, tc.ns, allow)
		switch {
		case tc.entry == "" && !errdefs.IsPermissionDenied(err):
			t.Errorf("%s for %s: %v, want PermissionDenied", tc.ref, tc.ns, err)
		case tc.entry == "" && strings.HasPrefix(tc.ref, "reg.example/") && !strings.Contains(err.Error(), "is not in this node's [checkpoint] registries allow-list for namespace "+tc.ns):
			t.Errorf("%s for %s: %v, want the namespace named", tc.ref, tc.ns, err)
		case tc.entry != "" && (err != nil || a.Host != tc.entry):
			t.Errorf("%s for %s: entry %q, %v; want %q", tc.ref, tc.ns, a.Host, err, tc.entry)
		}
	}
}

// An export naming no secret is refused before any connection unless its
// allow-list entry opted in to anonymous pushes.
func TestExportAnonymousOnlyByOptIn(t *testing.T) {
	r := newTestRegistry(t)
	src := twoContainers(t, t.TempDir(), "src")
	x := &Exporter{Registries: []Allowed{{Host: r.host + "/closed", Namespaces: everyNS, PlainHTTP: true},
		{Host: r.host + "/open", Namespaces: everyNS, PlainHTTP: true, AnonymousPush: true}},
		Node: "n1", Timeout: time.Minute, Transport: r.tr}
	_, _, err := x.Export(context.Background(), "default", "web", "uid", "", r.ref("closed/web:v1"), src)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "does not allow anonymous pushes (anonymous_push)") {
		t.Fatalf("anonymous push without the opt-in: %v", err)
	}
	if b, m := r.tr.reset(); b+m > 0 {
		t.Fatalf("the refused push wrote %d blobs, %d manifests", b, m)
	}
	if _, digest, err := x.Export(context.Background(), "default", "web", "uid", "", r.ref("open/web:v1"), src); err != nil || digest == "" {
		t.Fatalf("anonymous push with the opt-in: %q, %v", digest, err)
	}
}

// authRegistry is an in-process registry that wants basic auth u:p.
func authRegistry(t *testing.T) *testRegistry {
	return newUsersRegistry(t, map[string]string{"u": "p"}).testRegistry
}

// An export pushes with the secret named in spec.export only when the
// source pod lists it (the only secrets a node reads), anonymously without
// one where the entry allows it (never with the node's credentials), and
// returns the index's digest.
func TestExportCredentials(t *testing.T) {
	r := authRegistry(t)
	src := twoContainers(t, t.TempDir(), "src")
	cs := podAPI(t, dockerSecret("pull", r.host, "u", "p"))
	unlisted := dockerSecret("unlisted", r.host, "u", "p")
	if _, err := cs.CoreV1().Secrets("default").Create(context.Background(), unlisted, metav1CreateOptions); err != nil {
		t.Fatal(err)
	}
	x := &Exporter{Registries: []Allowed{{Host: r.host, Namespaces: everyNS, PlainHTTP: true, AnonymousPush: true}}, Node: "n1", Timeout: time.Minute, Transport: r.tr,
		Resources: func() kubeapi.Resources { return kubeapitest.Clientset{Interface: cs} }}
	img := r.ref("cp/web:v1")
	if _, _, err := x.Export(context.Background(), "default", "web", "uid-new", "", img, src); err == nil {
		t.Fatal("pushed anonymously to a registry that wants credentials")
	}
	if _, _, err := x.Export(context.Background(), "default", "web", "uid-new", "unlisted", img, src); !errdefs.IsFailedPrecondition(err) ||
		!strings.Contains(err.Error(), "not in the source pod's imagePullSecrets") {
		t.Fatalf("a secret the pod does not list: %v", err)
	}
	if _, _, err := x.Export(context.Background(), "default", "web", "uid-old", "pull", img, src); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("the source pod replaced: %v", err)
	}
	ref, digest, err := x.Export(context.Background(), "default", "web", "uid-new", "pull", img, src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, r.host+"/cp/web@sha256:") || !strings.HasSuffix(ref, digest) {
		t.Fatalf("pushed %s, digest %s", ref, digest)
	}
	creds := remote.WithAuthFromKeychain(authsKeychain{r.host: {Username: "u", Password: "p"}})
	got, err := remote.Get(mustRef(t, r.ref("cp/web:v1")), creds, remote.WithTransport(r.tr))
	if err != nil || got.Digest.String() != digest {
		t.Fatalf("the registry's cp/web:v1: %v, %v; pushed %s", got, err, digest)
	}
}

var metav1CreateOptions = metav1.CreateOptions{}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	must(t, err)
	return r
}
