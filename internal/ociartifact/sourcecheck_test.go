package ociartifact

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// pathRecorder records the method and path of every request.
type pathRecorder struct {
	rt  http.RoundTripper
	mu  sync.Mutex
	got []string
}

func (p *pathRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	p.got = append(p.got, req.Method+" "+req.URL.Path)
	p.mu.Unlock()
	return p.rt.RoundTrip(req)
}

func (p *pathRecorder) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// CheckSource reads the index alone (no blob, no other manifest) and
// returns its annotations; each refusal has its errdefs class, and a
// reference outside the allow-list or malformed makes no request.
func TestCheckSource(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	rec := &pathRecorder{rt: r.tr}
	p := puller(r, root, func(c *RestorePullConfig) { c.Transport = rec })
	ctx := context.Background()
	info, err := p.CheckSource(ctx, "default", "web", "uid", ref)
	must(t, err)
	want := SourceInfo{Digest: ref[strings.Index(ref, "@")+1:], PodNamespace: "default", PodName: "web", PodUID: "uid-1",
		CheckpointedAt: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC), Containers: []string{"app", "sidecar"}}
	if info.Digest != want.Digest || info.PodNamespace != want.PodNamespace || info.PodName != want.PodName || info.PodUID != want.PodUID ||
		!info.CheckpointedAt.Equal(want.CheckpointedAt) || !slices.Equal(info.Containers, want.Containers) {
		t.Errorf("info %+v, want %+v", info, want)
	}
	for _, req := range rec.list() {
		if strings.Contains(req, "/blobs/") || strings.Contains(req, "/manifests/") && !strings.HasSuffix(req, want.Digest) {
			t.Errorf("request %q: a check reads the index alone", req)
		}
	}
	if ents := rec.list(); len(ents) == 0 {
		t.Error("no request made")
	}

	// A plain image, not a pod checkpoint.
	img, err := random.Image(256, 1)
	must(t, err)
	plainRef, err := name.ParseReference(r.ref("plain/img:v1"), name.Insecure)
	must(t, err)
	must(t, remote.Write(plainRef, img, remote.WithTransport(r.tr)))
	imgDigest, err := img.Digest()
	must(t, err)

	down := httptest.NewServer(http.NotFoundHandler())
	downHost := strings.TrimPrefix(down.URL, "http://")
	down.Close()
	downRef := downHost + "/cp/web@" + want.Digest

	for _, tc := range []struct {
		name, ns, ref string
		allow         []Allowed
		class         func(error) bool
		noRequest     bool
	}{
		{name: "not allow-listed", ns: "default", ref: ref, allow: []Allowed{{Host: "reg.example", Namespaces: everyNS}}, class: errdefs.IsPermissionDenied, noRequest: true},
		{name: "no allow-list", ns: "default", ref: ref, allow: []Allowed{}, class: errdefs.IsPermissionDenied, noRequest: true},
		{name: "by tag", ns: "default", ref: r.ref("cp/web:v1"), class: errdefs.IsInvalidArgument, noRequest: true},
		{name: "unknown digest", ns: "default", ref: r.ref("cp/web@sha256:" + strings.Repeat("1", 64)), class: errdefs.IsNotFound},
		{name: "not a checkpoint", ns: "default", ref: r.ref("plain/img@" + imgDigest.String()), class: errdefs.IsFailedPrecondition},
		{name: "another namespace", ns: "other", ref: ref, class: func(err error) bool { return errors.Is(err, layout.ErrForeignCheckpoint) }},
		{name: "registry down", ns: "default", ref: downRef, allow: []Allowed{{Host: downHost, Namespaces: everyNS, PlainHTTP: true}}, class: errdefs.IsUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &pathRecorder{rt: http.DefaultTransport}
			q := puller(r, root, func(c *RestorePullConfig) {
				c.Transport = rec
				if tc.allow != nil {
					c.Registries = tc.allow
				}
			})
			info, err := q.CheckSource(ctx, tc.ns, "web", "uid", tc.ref)
			if !tc.class(err) {
				t.Fatalf("%v (%+v), want another class", err, info)
			}
			if info.PodName != "" {
				t.Errorf("a refusal returned %+v", info)
			}
			if n := len(rec.list()); tc.noRequest && n > 0 {
				t.Errorf("%d requests made: %v", n, rec.list())
			}
		})
	}
}

// A registry that wants credentials gets the restoring pod's secret's; it
// refuses the check without them, answered as a digest it does not have.
func TestCheckSourceUsesPodSecret(t *testing.T) {
	r := authRegistry(t)
	p0 := pushWithLogin(t, r)
	root := t.TempDir()
	_, err := puller(r, root, nil).CheckSource(context.Background(), "default", "web", "uid-new", p0.Ref)
	if !errdefs.IsNotFound(err) || err.Error() != notReadable(p0.Ref).Error() {
		t.Fatalf("without credentials: %v", err)
	}
	cs := podAPI(t, dockerSecret("pull", r.host, "u", "p"))
	withSecret := puller(r, root, func(c *RestorePullConfig) {
		c.PodKeychain = func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error) {
			return PodKeychain(ctx, kubeapitest.Clientset{Interface: cs}, nil, "n1", ns, pod, uid, discard())
		}
	})
	info, err := withSecret.CheckSource(context.Background(), "default", "web", "uid-new", p0.Ref)
	if err != nil || info.Digest != p0.Digest.String() {
		t.Fatalf("with the pod's secret: %+v %v", info, err)
	}
	// A restoring pod that is not the sandbox's is the pod's trouble: retried.
	if _, err := withSecret.CheckSource(context.Background(), "default", "web", "uid-old", p0.Ref); !errdefs.IsUnavailable(err) {
		t.Fatalf("replaced pod: %v", err)
	}
}

// A tenant cannot use the check as an oracle about repositories it cannot
// read: a repository outside its namespace's entries is refused before any
// request; a digest the registry lacks, one it refuses the credentials for,
// and a foreign namespace's checkpoint only the node's credentials read all
// get the same answer. What the pod's own secret reads is told precisely.
func TestCheckSourceTellsNothingOfOthersRepositories(t *testing.T) {
	r := authRegistry(t)
	p0 := pushWithLogin(t, r) // a checkpoint of namespace "default"
	missing := r.ref("cp/web@sha256:" + strings.Repeat("1", 64))
	nodeAuth := filepath.Join(t.TempDir(), "config.json")
	must(t, os.WriteFile(nodeAuth, []byte(`{"auths":{"`+r.host+`":{"username":"u","password":"p"}}}`), 0o600))
	rec := &pathRecorder{rt: r.tr}
	node := puller(r, t.TempDir(), func(c *RestorePullConfig) {
		c.NodeAuthFile, c.Transport = nodeAuth, rec
		c.Registries = []Allowed{{Host: r.host + "/cp", Namespaces: everyNS, PlainHTTP: true},
			{Host: r.host + "/private", Namespaces: []string{"default"}, PlainHTTP: true}}
	})
	ctx := context.Background()
	if _, err := node.CheckSource(ctx, "other", "web", "uid", r.ref("private/web@"+p0.Digest.String())); !errdefs.IsPermissionDenied(err) || len(rec.list()) > 0 {
		t.Fatalf("a repository outside the namespace's entries: %v, %d requests", err, len(rec.list()))
	}
	foreign, err := node.CheckSource(ctx, "other", "web", "uid", p0.Ref)
	if err == nil || foreign.PodNamespace != "" {
		t.Fatalf("a foreign checkpoint read with the node's credentials: %+v %v", foreign, err)
	}
	_, absent := node.CheckSource(ctx, "other", "web", "uid", missing)
	must(t, os.WriteFile(filepath.Join(filepath.Dir(nodeAuth), "empty.json"), []byte(`{}`), 0o600))
	anon := puller(r, t.TempDir(), func(c *RestorePullConfig) { c.NodeAuthFile = filepath.Join(filepath.Dir(nodeAuth), "empty.json") })
	_, refused := anon.CheckSource(ctx, "other", "web", "uid", p0.Ref)
	for what, e := range map[string]error{"a foreign checkpoint the node reads": err, "a digest the registry lacks": absent, "credentials refused": refused} {
		got := strings.ReplaceAll(fmt.Sprint(e), missing, p0.Ref)
		if !errdefs.IsNotFound(e) || got != notReadable(p0.Ref).Error() {
			t.Errorf("%s: %v; want the one answer", what, e)
		}
	}
	// The pod's own secret reads it: the tenant may read it anyway, and is
	// told why it may not restore it.
	cs := podAPI(t, dockerSecret("pull", r.host, "u", "p"))
	own := puller(r, t.TempDir(), func(c *RestorePullConfig) {
		c.NodeAuthFile = filepath.Join(filepath.Dir(nodeAuth), "empty.json")
		c.PodKeychain = func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error) {
			return PodKeychain(ctx, kubeapitest.Clientset{Interface: cs}, nil, "n1", "default", pod, uid, discard())
		}
	})
	if _, err := own.CheckSource(ctx, "other", "web", "uid-new", p0.Ref); !errors.Is(err, layout.ErrForeignCheckpoint) {
		t.Fatalf("a foreign checkpoint the pod's own secret reads: %v", err)
	}
}

// Index annotations go into an object's status: names must have
// Kubernetes' forms and the container list must match the index.
func TestSourceInfoRefusesHostileAnnotations(t *testing.T) {
	base := func() *pulledIndex {
		idx := &pulledIndex{containers: []pulledContainer{{name: "app"}, {name: "side"}}}
		idx.raw = &v1.IndexManifest{}
		idx.raw.Annotations = map[string]string{AnnotationPodNamespace: "default", AnnotationPodName: "web", AnnotationPodUID: "u-1",
			AnnotationCheckpointedAt: "2026-11-23T10:00:00Z", AnnotationContainers: "side,app"}
		return idx
	}
	info, err := sourceInfo(base())
	if err != nil || !slices.Equal(info.Containers, []string{"side", "app"}) {
		t.Fatalf("good index: %+v %v", info, err)
	}
	for k, v := range map[string]string{
		AnnotationPodNamespace:   "Default/x",
		AnnotationPodName:        strings.Repeat("a", 254),
		AnnotationPodUID:         "u 1",
		AnnotationCheckpointedAt: "yesterday",
		AnnotationContainers:     "app,app",
	} {
		idx := base()
		idx.raw.Annotations[k] = v
		if _, err := sourceInfo(idx); err == nil {
			t.Errorf("%s=%q accepted", k, v)
		}
	}
}
