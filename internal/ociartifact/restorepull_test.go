package ociartifact

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
	"github.com/cri-shim/cri-shim/internal/layout"
)

const zeroDigest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// Image references a pod names are refused unless they spell out an
// allow-listed registry and pin a sha256 digest.
func TestRestoreRefRules(t *testing.T) {
	allow := []Allowed{{Host: "127.0.0.1:5000", Namespaces: everyNS, PlainHTTP: true}, {Host: "reg.example", Namespaces: everyNS}}
	for _, tc := range []struct {
		ref   string
		allow []Allowed
		kind  error
		says  string
	}{
		{"127.0.0.1:5000/cp/web@" + zeroDigest, allow, nil, ""},
		{"reg.example/cp/web:v1@" + zeroDigest, allow, nil, ""},
		{"127.0.0.1:5000/cp/web@" + zeroDigest, nil, errdefs.ErrPermissionDenied, "allow-list is empty"},
		{"evil.example:443/cp/web@" + zeroDigest, allow, errdefs.ErrPermissionDenied, `registry "evil.example:443" is not in this node's [checkpoint] registries`},
		{"127.0.0.1:5001/cp/web@" + zeroDigest, allow, errdefs.ErrPermissionDenied, "not in this node's"},
		{"127.0.0.1:5000/cp/web:v1", allow, errdefs.ErrInvalidArgument, "by digest"},
		{"cp/web@" + zeroDigest, allow, errdefs.ErrInvalidArgument, "must begin with its registry host"},
		{"busybox@" + zeroDigest, allow, errdefs.ErrInvalidArgument, "must begin with its registry host"},
		{"docker.io/library/busybox@" + zeroDigest, []Allowed{{Host: "index.docker.io", Namespaces: everyNS}}, errdefs.ErrInvalidArgument, "is spelt"},
		{"127.0.0.1:5000/cp/web@sha256:abc", allow, errdefs.ErrInvalidArgument, "by digest"},
		{"127.0.0.1:5000/cp/web@sha512:" + strings.Repeat("0", 128), allow, errdefs.ErrInvalidArgument, ""},
		{"127.0.0.1:5000/" + strings.Repeat("a", 600) + "@" + zeroDigest, allow, errdefs.ErrInvalidArgument, "characters"},
		{"127.0.0.1:5000/../x@" + zeroDigest, allow, errdefs.ErrInvalidArgument, ""},
		{"reg.example/team-a/web@" + zeroDigest, []Allowed{{Host: "reg.example/team-a", Namespaces: []string{"default"}}}, nil, ""},
		{"reg.example/team-a/web@" + zeroDigest, []Allowed{{Host: "reg.example/team-a", Namespaces: []string{"a"}}}, errdefs.ErrPermissionDenied,
			"repository reg.example/team-a/web is not in this node's [checkpoint] registries allow-list for namespace default"},
		{"reg.example/team-ab/web@" + zeroDigest, []Allowed{{Host: "reg.example/team-a", Namespaces: everyNS}}, errdefs.ErrPermissionDenied, "for namespace default"},
	} {
		d, a, err := ParseRestoreRef(tc.ref, "default", tc.allow)
		if tc.kind == nil {
			if err != nil || d.DigestStr() != zeroDigest || a.Host == "" {
				t.Errorf("%s: %v (%v, %+v), want accepted", tc.ref, err, d, a)
			}
			continue
		}
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.ref, err, tc.kind, tc.says)
		}
	}
}

// A kubernetes.io/dockerconfigjson secret gives credentials per registry
// host however the key is spelt, and never names a credential helper.
func TestParseDockerConfigJSON(t *testing.T) {
	b := []byte(`{"auths":{"https://index.docker.io/v1/":{"auth":"dTpw"},"127.0.0.1:5000":{"username":"u","password":"p"},
		"http://Reg.Example/path":{"identitytoken":"tok"},"":{"username":"x"}},"credsStore":"evil","credHelpers":{"127.0.0.1:5000":"evil"}}`)
	got, err := ParseDockerConfigJSON(b)
	must(t, err)
	want := map[string]authn.AuthConfig{"index.docker.io": {Auth: "dTpw"}, "127.0.0.1:5000": {Username: "u", Password: "p"}, "reg.example": {IdentityToken: "tok"}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
	for _, bad := range []string{`{"auths":[]}`, `not json`, `{"auths":{"h":{"username":1}}}`} {
		if _, err := ParseDockerConfigJSON([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	if _, err := ParseDockerConfigJSON(bytes.Repeat([]byte(" "), maxDockerConfigBytes+1)); err == nil {
		t.Error("an oversized config was accepted")
	}
}

// podAPI is a fake API server with a pod of node "n1" and its secrets.
func podAPI(t *testing.T, secrets ...*corev1.Secret) *fake.Clientset {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-new"},
		Spec: corev1.PodSpec{NodeName: "n1"}}
	objs := []runtime.Object{pod}
	for _, s := range secrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s.Name})
		objs = append(objs, s)
	}
	pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: "missing"})
	return fake.NewClientset(objs...)
}

func dockerSecret(name, host, user, pass string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q}}}`, host, user, pass))}}
}

// The pod's image pull secrets are read as the node: the pod must be the
// sandbox's (UID) and on this node; missing and foreign-typed secrets are
// skipped; an API server that fails is Unavailable, not a wait.
func TestPodKeychain(t *testing.T) {
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "opaque", Namespace: "default"}, Type: corev1.SecretTypeOpaque}
	cs := podAPI(t, dockerSecret("first", "127.0.0.1:5000", "u", "p"), dockerSecret("second", "127.0.0.1:5000", "other", "x"), opaque)
	res := kubeapitest.Clientset{Interface: cs}
	ctx := context.Background()
	kc, err := PodKeychain(ctx, res, nil, "n1", "default", "web", "uid-new", discard())
	must(t, err)
	auth := resolve(t, kc, "127.0.0.1:5000/cp/web")
	if auth.Username != "u" || auth.Password != "p" {
		t.Errorf("credentials %+v, want the first secret's", auth)
	}
	if a := resolve(t, kc, "reg.example/cp"); a.Username != "" {
		t.Errorf("another registry got %+v", a)
	}
	for _, tc := range []struct {
		node, uid string
		kind      error
	}{{"n2", "uid-new", errdefs.ErrFailedPrecondition}, {"n1", "uid-old", errdefs.ErrFailedPrecondition}} {
		if _, err := PodKeychain(ctx, res, nil, tc.node, "default", "web", tc.uid, discard()); !errors.Is(err, tc.kind) {
			t.Errorf("node %s uid %s: %v, want %v", tc.node, tc.uid, err, tc.kind)
		}
	}
	if _, err := PodKeychain(ctx, res, nil, "n1", "default", "gone", "uid-new", discard()); !errdefs.IsUnavailable(err) {
		t.Errorf("pod not in the API: %v", err)
	}
	if _, err := PodKeychain(ctx, nil, nil, "n1", "default", "web", "uid-new", discard()); !errdefs.IsUnavailable(err) {
		t.Errorf("no API connection: %v", err)
	}
	cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	})
	if _, err := PodKeychain(ctx, res, nil, "n1", "default", "web", "uid-new", discard()); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("API server down: %v", err)
	}
}

func resolve(t *testing.T, kc authn.Keychain, repo string) authn.AuthConfig {
	t.Helper()
	r, err := registryResource(repo)
	must(t, err)
	a, err := kc.Resolve(r)
	must(t, err)
	c, err := a.Authorization()
	must(t, err)
	return *c
}

// pushed pushes a two-container checkpoint (namespace "default") to r.
func pushed(t *testing.T, r *testRegistry) (root, ref string) {
	root = t.TempDir()
	src := twoContainers(t, t.TempDir(), "src")
	p, err := Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
	must(t, err)
	return root, p.Ref
}

func puller(r *testRegistry, root string, mod func(*RestorePullConfig)) *RestorePuller {
	cfg := RestorePullConfig{Root: root, Registries: []Allowed{{Host: r.host, Namespaces: everyNS, PlainHTTP: true}},
		NodeAuthFile: filepath.Join(root, "..", "no-such-config.json"), Timeout: time.Minute, Wait: 10 * time.Second,
		RestoreAllowed: func(from, to string) bool { return from == to }, Transport: r.tr}
	cfg.NodeAuthFile = ""
	if mod != nil {
		mod(&cfg)
	}
	return NewRestorePuller(cfg)
}

// A reference is pulled into oci-<digest>, verified, and then answered from
// disk without asking the registry again.
func TestRestorePullByDigest(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	p := puller(r, root, nil)
	dir, err := p.Pull(context.Background(), "default", "web", "uid", ref, nil)
	must(t, err)
	if want := layout.PulledDir(ref[len(ref)-64:]); dir != want {
		t.Fatalf("pulled into %q, want %q", dir, want)
	}
	if _, err := layout.ReadManifest(filepath.Join(root, dir)); err != nil {
		t.Fatal(err)
	}
	r.tr.rewrite = func(*http.Request, []byte) []byte { t.Error("the registry was asked again"); return nil }
	if again, err := p.Pull(context.Background(), "default", "web", "uid", ref, nil); err != nil || again != dir {
		t.Fatalf("second pull: %q %v", again, err)
	}
}

// A checkpoint of another namespace is refused once its manifest.json is
// read, before an archive byte is fetched, and nothing is written.
func TestRestorePullRefusesAnotherNamespace(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	var big int
	r.tr.rewrite = func(req *http.Request, b []byte) []byte {
		if len(b) > 200<<10 {
			big++
		}
		return b
	}
	_, err := puller(r, root, nil).Pull(context.Background(), "other", "web", "uid", ref, nil)
	if !errors.Is(err, layout.ErrForeignCheckpoint) {
		t.Fatalf("checkpoint of namespace default for a pod of other: %v", err)
	}
	if big != 0 {
		t.Errorf("%d archives fetched before the refusal", big)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("left under the root: %v", ents)
	}
}

// An index whose content does not match the digest the pod named is refused.
func TestRestorePullDigestMismatch(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	r.tr.rewrite = func(req *http.Request, b []byte) []byte {
		if strings.Contains(req.URL.Path, "/manifests/") && bytes.Contains(b, []byte(AnnotationFormat)) {
			return bytes.Replace(b, []byte(`"default"`), []byte(`"defaulu"`), 1)
		}
		return b
	}
	_, err := puller(r, root, nil).Pull(context.Background(), "default", "web", "uid", ref, nil)
	if err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("tampered index: %v", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("left under the root: %v", ents)
	}
	r.tr.rewrite = nil
	if _, err := puller(r, root, nil).Pull(context.Background(), "default", "web", "uid", ref[:len(ref)-64]+strings.Repeat("0", 64), nil); err == nil {
		t.Fatal("a digest the registry does not hold was pulled")
	}
}

// An API server that fails answers the kubelet Unavailable at once (the
// pull needs the pod's secrets first); nothing is fetched.
func TestRestorePullAPIDown(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	cs := podAPI(t)
	cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	p := puller(r, root, func(c *RestorePullConfig) {
		c.PodKeychain = func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error) {
			return PodKeychain(ctx, kubeapitest.Clientset{Interface: cs}, nil, "n1", ns, pod, uid, discard())
		}
	})
	t0 := time.Now()
	_, err := p.Pull(context.Background(), "default", "web", "uid-new", ref, nil)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "connection refused") || time.Since(t0) > 5*time.Second {
		t.Fatalf("API down: %v after %s", err, time.Since(t0))
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("left under the root: %v", ents)
	}
}

// A pull slower than Wait answers Unavailable with its progress and goes
// on; the kubelet's retry finds it done.
func TestRestorePullAnswersRetryableWhileSlow(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	release := make(chan struct{})
	var once sync.Once
	r.tr.rewrite = func(req *http.Request, b []byte) []byte {
		if len(b) > 200<<10 {
			<-release
		}
		return b
	}
	p := puller(r, root, func(c *RestorePullConfig) { c.Wait = 200 * time.Millisecond })
	defer once.Do(func() { close(release) })
	_, err := p.Pull(context.Background(), "default", "web", "uid", ref, nil)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "kubelet retries") {
		t.Fatalf("slow pull: %v", err)
	}
	once.Do(func() { close(release) })
	var dir string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if dir, err = p.Pull(context.Background(), "default", "web", "uid", ref, nil); err == nil {
			break
		}
	}
	if err != nil || !strings.HasPrefix(dir, layout.PulledDirPrefix) {
		t.Fatalf("retry after the pull: %q %v", dir, err)
	}
}

// A registry that wants credentials gets the pod's secret's, and refuses
// a pull without them.
func TestRestorePullUsesPodSecret(t *testing.T) {
	r := authRegistry(t)
	p0 := pushWithLogin(t, r)
	root := t.TempDir()
	cs := podAPI(t, dockerSecret("pull", r.host, "u", "p"))
	withSecret := puller(r, root, func(c *RestorePullConfig) {
		c.PodKeychain = func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error) {
			return PodKeychain(ctx, kubeapitest.Clientset{Interface: cs}, nil, "n1", ns, pod, uid, discard())
		}
	})
	if _, err := puller(r, root, nil).Pull(context.Background(), "default", "web", "uid-new", p0.Ref, nil); err == nil {
		t.Fatal("pulled without credentials")
	}
	if _, err := withSecret.Pull(context.Background(), "default", "web", "uid-new", p0.Ref, nil); err != nil {
		t.Fatalf("with the pod's secret: %v", err)
	}
}

// A pull that the node's cap has no room for is refused ResourceExhausted
// before an archive byte is fetched, and writes nothing; a reservation is
// released once the pull ends.
func TestRestorePullRefusedOverTheCap(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	var big atomic.Int64
	r.tr.rewrite = func(req *http.Request, b []byte) []byte {
		if len(b) > 200<<10 {
			big.Add(1)
		}
		return b
	}
	var asked int64
	_, err := puller(r, root, nil).Pull(context.Background(), "default", "web", "uid", ref, func(n int64) (func(), error) {
		asked = n
		return nil, fmt.Errorf("%w: over [checkpoint] pull_max_total_bytes", errdefs.ErrResourceExhausted)
	})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "pull_max_total_bytes") {
		t.Fatalf("over the cap: %v", err)
	}
	if asked == 0 || big.Load() != 0 {
		t.Errorf("reserve asked for %d bytes; %d archives fetched before the refusal", asked, big.Load())
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("left under the root: %v", ents)
	}
	var released atomic.Int64
	if _, err := puller(r, root, nil).Pull(context.Background(), "default", "web", "uid", ref, func(int64) (func(), error) {
		return func() { released.Add(1) }, nil
	}); err != nil {
		t.Fatal(err)
	}
	if released.Load() != 1 {
		t.Errorf("released %d times, want once", released.Load())
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func registryResource(repo string) (authn.Resource, error) { return name.NewRepository(repo) }

// A pulled checkpoint's directory left incomplete (a removal killed midway:
// the archives and manifest gone, the access record written into it as it
// was deleted) is not taken for pulled, nor touched: it is removed and the
// reference pulled again.
func TestRestorePullRepullsIncompleteDirectory(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	p := puller(r, root, nil)
	dir, err := p.Pull(context.Background(), "default", "web", "uid", ref, nil)
	must(t, err)
	full := filepath.Join(root, dir)
	must(t, os.RemoveAll(filepath.Join(full, "containers")))
	must(t, os.Remove(filepath.Join(full, layout.ManifestFile)))
	old := time.Now().Add(-time.Hour)
	os.Chtimes(full, old, old)
	var asked atomic.Int64
	r.tr.rewrite = func(_ *http.Request, b []byte) []byte { asked.Add(1); return b }
	again, err := p.Pull(context.Background(), "default", "web", "uid2", ref, nil)
	if err != nil || again != dir {
		t.Fatalf("pull over an incomplete directory: %q %v", again, err)
	}
	if asked.Load() == 0 {
		t.Error("the registry was not asked: the incomplete directory was taken for pulled")
	}
	if _, err := layout.ReadPulled(full); err != nil {
		t.Errorf("after the pull: %v", err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 1 {
		t.Errorf("under the root: %v, want the pulled directory only", ents)
	}
}

// No access record is written into a directory that holds no complete
// checkpoint (one being removed, or left incomplete): it would be the only
// file there.
func TestRecordAccessNotIntoIncomplete(t *testing.T) {
	root := t.TempDir()
	p := NewRestorePuller(RestorePullConfig{Root: root})
	dir := filepath.Join(root, layout.PulledDir(strings.Repeat("a", 64)))
	must(t, os.Mkdir(dir, 0o700))
	p.recordAccess(dir, "reg.example/cp/web", podCredential{})
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("written into an incomplete directory: %v", ents)
	}
	p.recordAccess(filepath.Join(root, "gone"), "reg.example/cp/web", podCredential{})
	if _, err := os.Lstat(filepath.Join(root, "gone")); !os.IsNotExist(err) {
		t.Errorf("a removed directory was recreated: %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A pulled checkpoint removed (by the cap or the sweep: renamed away) while
// a pod's access to it is checked is answered Unavailable, not handed to the
// warm start, and nothing is written under its name: the retry pulls again.
func TestRestorePullRemovedWhileChecked(t *testing.T) {
	r := newUsersRegistry(t, map[string]string{"alice": "pw-a", "bob": "pw-b"})
	ref := pushedTo(t, r, "alice", "pw-a")
	root := t.TempDir()
	var evict atomic.Bool
	var evicted string
	p := puller(r.testRegistry, root, func(c *RestorePullConfig) {
		c.PodKeychain = podSecrets(r.host, map[string][2]string{"uid-a": {"alice", "pw-a"}, "uid-b": {"bob", "pw-b"}})
		c.Transport = roundTripFunc(func(req *http.Request) (*http.Response, error) {
			// The access check's request: the index GET by digest.
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/manifests/") && evict.CompareAndSwap(true, false) {
				ents, _ := os.ReadDir(root)
				for _, e := range ents {
					evicted = filepath.Join(root, ".removing-"+e.Name())
					must(t, os.Rename(filepath.Join(root, e.Name()), evicted))
				}
			}
			return r.tr.RoundTrip(req)
		})
	})
	dir, err := p.Pull(context.Background(), "default", "a", "uid-a", ref, nil)
	must(t, err)
	before, err := os.ReadFile(filepath.Join(root, dir, AccessFile))
	must(t, err)
	evict.Store(true)
	_, err = p.Pull(context.Background(), "default", "b", "uid-b", ref, nil)
	if evict.Load() {
		t.Fatal("the access check made no index GET: the checkpoint was not removed while checked")
	}
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "kubelet retries") {
		t.Fatalf("checkpoint removed while checked: %v, want Unavailable", err)
	}
	if _, err := os.Lstat(filepath.Join(root, dir)); !os.IsNotExist(err) {
		t.Errorf("something left under the removed checkpoint's name: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(evicted, AccessFile)); !bytes.Equal(b, before) {
		t.Errorf("the access record was written into the directory being removed: %s", b)
	}
}

// pushWithLogin pushes a two-container pod checkpoint to r with the login
// its pods' secrets carry (u:p).
func pushWithLogin(t *testing.T, r *testRegistry) *Pushed {
	t.Helper()
	src := twoContainers(t, t.TempDir(), "src")
	creds := authsKeychain{r.host: {Username: "u", Password: "p"}}
	p0, err := Push(context.Background(), src, r.ref("cp/web:v1"), Registry{PlainHTTP: true, Transport: r.tr, Keychain: creds}, nil)
	must(t, err)
	return p0
}

// Provenance is judged before the registry is asked anything: a digest the
// check refuses is answered with its error, and nothing is fetched; one it
// accepts is pulled.
func TestRestorePullProvenanceBeforeAnyByte(t *testing.T) {
	r := newTestRegistry(t)
	root, ref := pushed(t, r)
	var asked []string
	p := puller(r, root, func(c *RestorePullConfig) {
		c.Provenance = func(_ context.Context, ns, repo, digest string) error {
			asked = append(asked, ns+" "+repo+" "+digest)
			if digest == ref[strings.LastIndex(ref, "@")+1:] && ns == "default" && repo == ref[:strings.LastIndex(ref, "@")] {
				return nil
			}
			return fmt.Errorf("%w: not exported by this cluster", errdefs.ErrPermissionDenied)
		}
	})
	r.tr.rewrite = func(*http.Request, []byte) []byte { t.Error("the registry was asked for a refused digest"); return nil }
	other := ref[:strings.LastIndex(ref, "@")+1] + "sha256:" + strings.Repeat("a", 64)
	if _, err := p.Pull(context.Background(), "default", "web", "uid", other, nil); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("want PermissionDenied for a digest no node exported, got %v", err)
	}
	r.tr.rewrite = nil
	if _, err := p.Pull(context.Background(), "default", "web", "uid", ref, nil); err != nil {
		t.Fatalf("an exported digest: %v", err)
	}
	if len(asked) != 2 || asked[1] != "default "+ref[:strings.LastIndex(ref, "@")]+" "+ref[strings.LastIndex(ref, "@")+1:] {
		t.Fatalf("provenance asked %v, want the namespace, the reference's repository and its digest", asked)
	}
}

// A checkpoint whose own content the checks refuse (here manifest.json
// giving an archive a size its image does not have) is a permanent refusal:
// FailedPrecondition of class layout.ErrCheckpointRefused, nothing written,
// and the same digest is answered again, for any pod, without a request to
// the registry.
func TestRestorePullContentRefusalIsKept(t *testing.T) {
	r := newTestRegistry(t)
	root := t.TempDir()
	src := twoContainers(t, t.TempDir(), "src")
	mf := filepath.Join(src, layout.ManifestFile)
	b, err := os.ReadFile(mf)
	must(t, err)
	var m map[string]any
	must(t, json.Unmarshal(b, &m))
	c0 := m["containers"].([]any)[0].(map[string]any)
	c0["sizeBytes"] = c0["sizeBytes"].(float64) + 1
	b, err = json.Marshal(m)
	must(t, err)
	must(t, os.WriteFile(mf, b, 0o600))
	pushed, err := Push(context.Background(), src, r.ref("cp/web:v1"), r.reg(), nil)
	must(t, err)
	p := puller(r, root, nil)
	_, err = p.Pull(context.Background(), "default", "web", "uid1", pushed.Ref, nil)
	if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, layout.ErrCheckpointRefused) || !strings.Contains(err.Error(), "archive of") {
		t.Fatalf("archive size other than manifest.json's: %v, want FailedPrecondition, a checkpoint refusal", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("left under the root: %v", ents)
	}
	var asked int
	r.tr.rewrite = func(_ *http.Request, b []byte) []byte { asked++; return b }
	for _, uid := range []string{"uid1", "uid2"} {
		if _, err := p.Pull(context.Background(), "default", "web2", uid, pushed.Ref, nil); !errors.Is(err, layout.ErrCheckpointRefused) {
			t.Fatalf("pull again for %s: %v, want the kept refusal", uid, err)
		}
	}
	if asked != 0 {
		t.Errorf("the registry was asked %d times again for a refused digest", asked)
	}
}

// A namespace holds at most its share of the pull slots: another
// namespace's pod still finds one, until the node's bound.
func TestPullSlotsPerNamespace(t *testing.T) {
	p := NewRestorePuller(RestorePullConfig{})
	hold := make(chan struct{})
	defer close(hold)
	block := func(*pullJob) error { <-hold; return nil }
	start := func(kind int, ns string, i int) error {
		_, err := p.job(kind, fmt.Sprintf("oci-%d/%s", i, ns), ns, fmt.Sprintf("%s-%d", ns, i), block)
		return err
	}
	for i := range maxNSPullJobs {
		if err := start(jobPull, "a", i); err != nil {
			t.Fatalf("pull %d of namespace a: %v", i, err)
		}
	}
	err := start(jobPull, "a", 99)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "namespace a") {
		t.Fatalf("a pull beyond namespace a's share: %v, want Unavailable naming it", err)
	}
	for i := range maxPullJobs - maxNSPullJobs {
		if err := start(jobPull, fmt.Sprintf("b%d", i), i); err != nil {
			t.Fatalf("another namespace's pull: %v", err)
		}
	}
	if err := start(jobPull, "c", 0); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "pulls in progress on this node") {
		t.Fatalf("a pull beyond the node's bound: %v", err)
	}
}
