package ociartifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
)

// usersRegistry is an in-process registry that wants basic auth of one of
// users (name: password), or none when users is empty, and counts the
// requests it is sent by method, and the blob reads.
type usersRegistry struct {
	*testRegistry
	heads, gets, blobGets atomic.Int64
	// openHeads answers HEAD requests without asking for credentials (a
	// registry or cache that answers the digest header to anyone).
	openHeads atomic.Bool
}

func newUsersRegistry(t *testing.T, users map[string]string) *usersRegistry {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	u := &usersRegistry{}
	allowed := map[string]bool{}
	for n, p := range users {
		allowed["Basic "+base64.StdEncoding.EncodeToString([]byte(n+":"+p))] = true
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch {
		case req.Method == http.MethodHead:
			u.heads.Add(1)
		case req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/"):
			u.blobGets.Add(1)
			u.gets.Add(1)
		case req.Method == http.MethodGet && req.URL.Path != "/v2/":
			u.gets.Add(1)
		}
		if len(allowed) > 0 && !allowed[req.Header.Get("Authorization")] && !(req.Method == http.MethodHead && u.openHeads.Load()) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	u.testRegistry = &testRegistry{host: strings.TrimPrefix(srv.URL, "http://"), tr: &countingTransport{rt: http.DefaultTransport}}
	return u
}

// requests is every registry request but the API version checks.
func (u *usersRegistry) requests() int64 { return u.heads.Load() + u.gets.Load() }

// podSecrets answers PodKeychain with each pod's (by UID) credentials for
// the registry, none for a pod not listed.
func podSecrets(host string, creds map[string][2]string) func(context.Context, string, string, string) (authn.Keychain, error) {
	return func(_ context.Context, _, _, uid string) (authn.Keychain, error) {
		c, ok := creds[uid]
		if !ok {
			return authsKeychain{}, nil
		}
		return authsKeychain{host: {Username: c[0], Password: c[1]}}, nil
	}
}

func pushedTo(t *testing.T, r *usersRegistry, user, pass string) string {
	t.Helper()
	src := twoContainers(t, t.TempDir(), "src")
	p, err := Push(context.Background(), src, r.ref("cp/web:v1"), Registry{PlainHTTP: true, Transport: r.tr,
		Keychain: authsKeychain{r.host: {Username: user, Password: pass}}}, nil)
	must(t, err)
	return p.Ref
}

// A checkpoint on the node is answered to another pod only once the
// registry lets that pod's credentials read it: the same credential (in any
// secret) is recorded and asks nothing, a new one is asked with one index
// GET and no blob, a refused one is PermissionDenied, and the record holds no secret.
func TestPulledCheckpointAccessIsVerified(t *testing.T) {
	r := newUsersRegistry(t, map[string]string{"alice": "s3cret-alice", "bob": "s3cret-bob"})
	ref := pushedTo(t, r, "alice", "s3cret-alice")
	root := t.TempDir()
	p := puller(r.testRegistry, root, func(c *RestorePullConfig) {
		c.PodKeychain = podSecrets(r.host, map[string][2]string{
			"uid-a": {"alice", "s3cret-alice"}, "uid-a2": {"alice", "s3cret-alice"},
			"uid-b": {"bob", "s3cret-bob"}, "uid-b2": {"bob", "s3cret-bob"},
			"uid-m": {"mallory", "guess"},
		})
	})
	ctx := context.Background()
	dir, err := p.Pull(ctx, "default", "a", "uid-a", ref, nil)
	must(t, err)
	rec, err := os.ReadFile(filepath.Join(root, dir, AccessFile))
	must(t, err)
	for _, secret := range []string{"alice", "s3cret", "bob"} {
		if bytes.Contains(rec, []byte(secret)) {
			t.Fatalf("the access record holds %q: %s", secret, rec)
		}
	}

	step := func(pod, uid string, wantReq bool, wantErr error, says string) {
		t.Helper()
		req0, blobs0 := r.requests(), r.blobGets.Load()
		got, err := p.Pull(ctx, "default", pod, uid, ref, nil)
		switch {
		case wantErr == nil && (err != nil || got != dir):
			t.Errorf("%s: %q %v, want %q", pod, got, err, dir)
		case wantErr != nil && (!errors.Is(err, wantErr) || !strings.Contains(fmt.Sprint(err), says)):
			t.Errorf("%s: %v, want %v saying %q", pod, err, wantErr, says)
		}
		if asked := r.requests() > req0; asked != wantReq {
			t.Errorf("%s: registry asked=%v, want %v", pod, asked, wantReq)
		}
		if r.blobGets.Load() != blobs0 {
			t.Errorf("%s: %d blobs fetched for a checkpoint on the node", pod, r.blobGets.Load()-blobs0)
		}
	}
	step("a", "uid-a", false, nil, "")   // the pod that pulled it
	step("a2", "uid-a2", false, nil, "") // the same credential, another secret
	step("b", "uid-b", true, nil, "")    // another credential the registry lets read it
	step("b2", "uid-b2", false, nil, "") // ... recorded
	step("m", "uid-m", true, errdefs.ErrPermissionDenied, "401 Unauthorized to the pod's imagePullSecrets")
	step("n", "uid-none", true, errdefs.ErrPermissionDenied, "the node's credentials")
	// A pod of a namespace the binding refuses is told so before anything
	// else, as by a pull: whether the registry would let it is not asked.
	req0 := r.requests()
	if _, err := p.Pull(ctx, "other", "m", "uid-m", ref, nil); !errors.Is(err, layout.ErrForeignCheckpoint) || r.requests() != req0 {
		t.Errorf("pod of another namespace: %v, %d registry requests", err, r.requests()-req0)
	}
	// A refusal is not recorded: asked again after failedFor (here: a new
	// puller over the same directory, as after a shim restart).
	p2 := puller(r.testRegistry, root, func(c *RestorePullConfig) {
		c.PodKeychain = podSecrets(r.host, map[string][2]string{"uid-m": {"mallory", "guess"}, "uid-b": {"bob", "s3cret-bob"}})
	})
	if _, err := p2.Pull(ctx, "default", "m", "uid-m", ref, nil); !errdefs.IsPermissionDenied(err) {
		t.Errorf("refused pod after a restart: %v", err)
	}
	req0 = r.requests()
	if _, err := p2.Pull(ctx, "default", "b", "uid-b", ref, nil); err != nil || r.requests() != req0 {
		t.Errorf("recorded pod after a restart: %v, %d requests", err, r.requests()-req0)
	}
}

// A registry that answers HEAD with the digest header to anyone does not
// let a pod whose credentials it refuses for the content restore the
// checkpoint on the node: the check reads the index (GET), not a header.
func TestPulledAccessNeedsTheIndexNotAHeader(t *testing.T) {
	r := newUsersRegistry(t, map[string]string{"alice": "s3cret-alice"})
	ref := pushedTo(t, r, "alice", "s3cret-alice")
	r.openHeads.Store(true)
	p := puller(r.testRegistry, t.TempDir(), func(c *RestorePullConfig) {
		c.PodKeychain = podSecrets(r.host, map[string][2]string{"uid-a": {"alice", "s3cret-alice"}, "uid-m": {"mallory", "guess"}})
	})
	ctx := context.Background()
	if _, err := p.Pull(ctx, "default", "a", "uid-a", ref, nil); err != nil {
		t.Fatal(err)
	}
	heads0, gets0, blobs0 := r.heads.Load(), r.gets.Load(), r.blobGets.Load()
	if _, err := p.Pull(ctx, "default", "m", "uid-m", ref, nil); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("pod whose credentials the registry refuses: %v, want PermissionDenied with the 401", err)
	}
	if r.gets.Load() == gets0 || r.heads.Load() != heads0 || r.blobGets.Load() != blobs0 {
		t.Errorf("access check made %d GETs (%d of blobs), %d HEADs; want one index GET",
			r.gets.Load()-gets0, r.blobGets.Load()-blobs0, r.heads.Load()-heads0)
	}
}

// The index read for an access check is capped like CheckSource's: an
// oversized answer is refused without being read whole.
func TestGetByDigestCapsAndChecks(t *testing.T) {
	big := bytes.Repeat([]byte("x"), maxIndexBytes+10)
	var served []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v2/" {
			return
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.index.v1+json")
		_, _ = w.Write(served)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	reg := Registry{Keychain: authsKeychain{}, PlainHTTP: true}
	for _, tc := range []struct {
		body []byte
		want error
	}{{big, errManifestTooLarge}, {[]byte(`{"schemaVersion":2}`), nil}} {
		served = tc.body
		sum := sha256.Sum256(tc.body)
		ref := host + "/cp/web@sha256:" + hex.EncodeToString(sum[:])
		r, opts, err := reg.connect(context.Background(), ref)
		must(t, err)
		d, ok := r.(name.Digest)
		if !ok {
			t.Fatalf("%s: not a digest reference", ref)
		}
		desc, err := getByDigest(r, d, opts)
		switch {
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%d bytes: %v, want %v", len(tc.body), err, tc.want)
		case tc.want == nil && (err != nil || !bytes.Equal(desc.Manifest, tc.body)):
			t.Errorf("%d bytes: %v", len(tc.body), err)
		}
	}
}

// A checkpoint read with the node's credentials or anonymously may be
// restored by any pod without asking the registry: the kubelet's
// NodePodsAccessible. (The namespace binding is judged by the warm start,
// TestWarmStartFromImageReference.)
func TestPublicPulledCheckpointIsNodeAccessible(t *testing.T) {
	r := newUsersRegistry(t, nil)
	ref := pushedTo(t, r, "", "")
	root := t.TempDir()
	var secretReads atomic.Int64
	secrets := podSecrets(r.host, map[string][2]string{"uid-s": {"someone", "anything"}})
	p := puller(r.testRegistry, root, func(c *RestorePullConfig) {
		c.PodKeychain = func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error) {
			secretReads.Add(1)
			return secrets(ctx, ns, pod, uid)
		}
	})
	dir, err := p.Pull(context.Background(), "default", "a", "uid-a", ref, nil)
	must(t, err)
	req0, reads0 := r.requests(), secretReads.Load()
	if got, err := p.Pull(context.Background(), "default", "s", "uid-s", ref, nil); err != nil || got != dir {
		t.Fatalf("another pod: %q %v", got, err)
	}
	if r.requests() != req0 || secretReads.Load() != reads0 {
		t.Errorf("for a checkpoint read anonymously, the registry was asked %d times and the pod's secrets read %d times",
			r.requests()-req0, secretReads.Load()-reads0)
	}
}

// Many pods restoring the same reference at once, some with credentials the
// registry refuses: every allowed one gets the directory at its first try
// (a pull refused to another pod's credentials does not answer it), every
// refused one PermissionDenied or the registry's 401, one pull is made, and
// the record stays readable.
func TestPulledAccessConcurrent(t *testing.T) {
	users := map[string]string{}
	creds := map[string][2]string{}
	for i := range 12 {
		uid := fmt.Sprintf("uid-%d", i)
		if i%3 == 0 {
			creds[uid] = [2]string{"bad", "x"}
			continue
		}
		user := fmt.Sprintf("user%d", i)
		users[user], creds[uid] = "pw"+user, [2]string{user, "pw" + user}
	}
	r := newUsersRegistry(t, users)
	ref := pushedTo(t, r, "user1", "pwuser1")
	root := t.TempDir()
	p := puller(r.testRegistry, root, func(c *RestorePullConfig) { c.PodKeychain = podSecrets(r.host, creds) })
	var wg sync.WaitGroup
	for uid := range creds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Pull(context.Background(), "default", "p-"+uid, uid, ref, nil)
			if bad := creds[uid][0] == "bad"; bad != (err != nil) || bad && !errdefs.IsPermissionDenied(err) && !strings.Contains(err.Error(), "401") {
				t.Errorf("%s (refused credentials: %v): %v", uid, bad, err)
			}
		}()
	}
	wg.Wait()
	ents, _ := os.ReadDir(root)
	if len(ents) != 1 {
		t.Fatalf("under the root: %v", ents)
	}
	b, err := os.ReadFile(filepath.Join(root, ents[0].Name(), AccessFile))
	must(t, err)
	rec, err := parseAccess(b)
	must(t, err)
	for _, a := range rec.Repos {
		if len(a.Credentials) != 8 {
			t.Errorf("%d credentials recorded, want the 8 the registry accepted", len(a.Credentials))
		}
	}
}

// The access record is bounded and parsed strictly; a credential is matched
// only by its salted hash.
func TestAccessRecordRules(t *testing.T) {
	r := newAccessRecord()
	c := podCredential{raw: []byte(`{"username":"u","password":"p"}`)}
	other := podCredential{raw: []byte(`{"username":"u","password":"q"}`)}
	if r.allows("h/r", c) || !r.add("h/r", c) || !r.allows("h/r", c) || r.allows("h/r", other) || r.allows("h/s", c) {
		t.Fatal("a credential is allowed exactly where it was recorded")
	}
	for i := range maxAccessCredentials + 5 {
		r.add("h/r", podCredential{raw: []byte(fmt.Sprint(i))})
	}
	if n := len(r.Repos["h/r"].Credentials); n != maxAccessCredentials {
		t.Errorf("%d credentials kept, at most %d", n, maxAccessCredentials)
	}
	if newAccessRecord().hash(c) == r.hash(c) {
		t.Error("two records hash a credential alike (no salt)")
	}
	for _, bad := range []string{`{}`, `{"salt":"00"}`, `not json`, `{"salt":"` + strings.Repeat("0", 64) + `","repositories":{"h/r":null}}`,
		`{"salt":"` + strings.Repeat("0", 64) + `","repositories":{"h/r":{"credentials":["zz"]}}}`} {
		if _, err := parseAccess([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
