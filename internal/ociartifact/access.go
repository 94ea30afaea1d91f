package ociartifact

// Who may read a pulled checkpoint. A checkpoint pulled for one pod stays on
// the node (oci-<digest>) and another pod naming the same reference would
// restore from it without the registry being asked. As the kubelet's
// "ensure secret pulled images" (KEP-2535; kubernetes v1.36.3
// pkg/kubelet/images/pullmanager/image_pull_manager.go, MustAttemptImagePull,
// with the credential hashes of pkg/credentialprovider/keyring.go,
// hashAuthConfig) does for images, the shim keeps, with the directory, a
// record of the credentials the registry let read it, by repository, and asks
// the registry again (a GET of the index by digest, at most 1 MiB, checked
// against the digest; no blob) for a pod whose credentials are not recorded.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// AccessFile is the record, in a pulled checkpoint's directory, of what the
// registry let read it. It goes with the directory.
const AccessFile = ".cri-shim-access.json"

// maxAccessCredentials bounds the credentials recorded per repository (the
// oldest is forgotten first: it is then verified again), and
// maxAccessRepos the repositories.
const (
	maxAccessCredentials = 64
	maxAccessRepos       = 64
	maxAccessFileBytes   = 1 << 20
)

// accessRecord is AccessFile. Credentials are recorded as HMAC-SHA256 of
// the credential (its docker AuthConfig as JSON) keyed by the record's own
// random salt: never the secret, and no hash that matches across nodes or
// directories.
type accessRecord struct {
	Salt  string                 `json:"salt"`
	Repos map[string]*repoAccess `json:"repositories"`
}

// repoAccess is what read one repository's reference.
type repoAccess struct {
	// NodeAccessible: read with the node's credentials or anonymously, so
	// any pod of the node may (the kubelet's NodePodsAccessible).
	NodeAccessible bool `json:"nodeAccessible,omitempty"`
	// Credentials are the pods' credentials the registry let read it.
	Credentials []string `json:"credentials,omitempty"`
}

// podCredential is what a pod reads a repository with: the entry of its
// image pull secrets for the registry (raw, only in memory), or none (the
// node's credentials, or anonymous).
type podCredential struct{ raw []byte }

func (c podCredential) fromPod() bool { return c.raw != nil }

// credentialOf is the credential of the pod's keychain kc (nil: no pod
// secrets) for repo.
func credentialOf(kc authn.Keychain, repo name.Repository) (podCredential, error) {
	if kc == nil {
		return podCredential{}, nil
	}
	a, err := kc.Resolve(repo)
	if err != nil {
		return podCredential{}, err
	}
	if a == authn.Anonymous {
		return podCredential{}, nil
	}
	cfg, err := a.Authorization()
	if err != nil {
		return podCredential{}, err
	}
	b, err := json.Marshal(cfg)
	return podCredential{raw: b}, err
}

func newAccessRecord() *accessRecord {
	salt := make([]byte, 32)
	rand.Read(salt)
	return &accessRecord{Salt: hex.EncodeToString(salt), Repos: map[string]*repoAccess{}}
}

// parseAccess reads an AccessFile; what does not hold (a torn or edited
// file) is an error, and the caller starts a new record: every pod is then
// verified again.
func parseAccess(b []byte) (*accessRecord, error) {
	if len(b) > maxAccessFileBytes {
		return nil, fmt.Errorf("%s of %d bytes", AccessFile, len(b))
	}
	var r accessRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", AccessFile, err)
	}
	if salt, err := hex.DecodeString(r.Salt); err != nil || len(salt) != 32 {
		return nil, fmt.Errorf("%s: salt is not 64 hex digits", AccessFile)
	}
	if len(r.Repos) > maxAccessRepos {
		return nil, fmt.Errorf("%s: %d repositories", AccessFile, len(r.Repos))
	}
	for repo, a := range r.Repos {
		if a == nil || len(a.Credentials) > maxAccessCredentials {
			return nil, fmt.Errorf("%s: repository %q: unreadable entry", AccessFile, repo)
		}
		for _, h := range a.Credentials {
			if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("%s: repository %q: credential hash %q", AccessFile, repo, h)
			}
		}
	}
	if r.Repos == nil {
		r.Repos = map[string]*repoAccess{}
	}
	return &r, nil
}

func (r *accessRecord) hash(c podCredential) string {
	salt, _ := hex.DecodeString(r.Salt)
	m := hmac.New(sha256.New, salt)
	m.Write(c.raw)
	return hex.EncodeToString(m.Sum(nil))
}

// allows reports whether the record lets credential c read repo's copy.
func (r *accessRecord) allows(repo string, c podCredential) bool {
	a := r.Repos[repo]
	switch {
	case a == nil:
		return false
	case a.NodeAccessible:
		return true
	}
	return c.fromPod() && slices.Contains(a.Credentials, r.hash(c))
}

// add records that c read repo, and reports whether that changed the record.
func (r *accessRecord) add(repo string, c podCredential) bool {
	if r.allows(repo, c) {
		return false
	}
	a := r.Repos[repo]
	if a == nil {
		if len(r.Repos) >= maxAccessRepos {
			return false // verified, not remembered: asked again next time
		}
		a = &repoAccess{}
		r.Repos[repo] = a
	}
	if !c.fromPod() {
		a.NodeAccessible, a.Credentials = true, nil
		return true
	}
	if len(a.Credentials) >= maxAccessCredentials {
		a.Credentials = a.Credentials[1:]
	}
	a.Credentials = append(a.Credentials, r.hash(c))
	return true
}

// readAccess reads dir's record; a missing or unreadable one is a new,
// empty record (an unreadable one is reported with it).
func readAccess(dir string) (*accessRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, AccessFile))
	if errors.Is(err, os.ErrNotExist) {
		return newAccessRecord(), nil
	}
	if err != nil {
		return newAccessRecord(), err
	}
	r, err := parseAccess(b)
	if err != nil {
		return newAccessRecord(), err
	}
	return r, nil
}

// writeAccess writes dir's record: a temporary file beside it, synced, then
// renamed over it while dir still holds its manifest (a directory renamed
// away for removal meanwhile makes the rename fail: nothing is left at the
// pulled checkpoint's name). The record is a cache of registry answers, not
// state the shim acts on: a failure is not statefile's.
func writeAccess(dir string, r *accessRecord) (err error) {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+AccessFile+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(dir, layout.ManifestFile)); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, AccessFile)); err != nil {
		return err
	}
	return statefile.SyncDir(dir)
}

// allowsAccess reports whether dir's record lets c read repo.
func (p *RestorePuller) allowsAccess(dir, repo string, c podCredential) bool {
	p.accessMu.Lock()
	defer p.accessMu.Unlock()
	r, err := readAccess(dir)
	if err != nil {
		p.cfg.Log.Warn("checkpoint: unreadable access record of a pulled checkpoint; pods are verified with the registry again", "dir", dir, "err", err)
	}
	return r.allows(repo, c)
}

// recordAccess adds to dir's record that c read repo. A record that cannot
// be written only costs a registry request at the next restore. It is
// written only into a complete pulled checkpoint, through a temporary file
// renamed into place: never into a directory being removed (renamed away by
// then: layout.RetirePulled), nor one left incomplete, which would then hold
// a record and nothing else.
func (p *RestorePuller) recordAccess(dir, repo string, c podCredential) {
	p.accessMu.Lock()
	defer p.accessMu.Unlock()
	if _, err := layout.ReadPulled(dir); err != nil {
		return // removed meanwhile; never recreate it
	}
	r, _ := readAccess(dir)
	if !r.add(repo, c) {
		return
	}
	if err := writeAccess(dir, r); err != nil {
		p.cfg.Log.Warn("checkpoint: recording who may read a pulled checkpoint", "dir", dir, "err", err)
	}
}

// verify checks that pod ns/pod (sandbox UID uid) may read reference d,
// whose checkpoint is already on the node in dirName: recorded in the
// directory's access record, or served by the registry to a GET of d with
// the pod's credentials (its image pull secrets, then the node's; the index
// only, at most maxIndexBytes, checked against d), which is then recorded. A registry that refuses (401, 403, 404) is PermissionDenied.
func (p *RestorePuller) verify(d name.Digest, allowed Allowed, dirName, ns, pod, uid string) error {
	ctx, cancel := context.WithTimeout(context.Background(), verifyTimeout)
	defer cancel()
	podKC, kc, err := p.keychains(ctx, ns, pod, uid)
	if err != nil {
		return err
	}
	repo := d.Context()
	cred, err := credentialOf(podKC, repo)
	if err != nil {
		return fmt.Errorf("%w: pod %s/%s's credentials for %s: %v", errdefs.ErrFailedPrecondition, ns, pod, repo.RegistryStr(), err)
	}
	dir := filepath.Join(p.cfg.Root, dirName)
	if p.allowsAccess(dir, repo.Name(), cred) {
		return nil
	}
	reg := Registry{Keychain: kc, CAFile: allowed.CAFile, PlainHTTP: allowed.PlainHTTP, Transport: p.cfg.Transport}
	r, opts, err := reg.connect(ctx, d.String())
	if err != nil {
		return fmt.Errorf("%w: verifying pod %s/%s may read %s: %v", errdefs.ErrFailedPrecondition, ns, pod, d, err)
	}
	// The index itself, read and checked against the digest, not a HEAD:
	// a Docker-Content-Digest header alone shows no read was allowed.
	if _, err := getByDigest(r, d, opts); err != nil {
		if refusal(err) {
			te := (*transport.Error)(nil)
			errors.As(err, &te)
			return fmt.Errorf("%w: pod %s/%s may not read %s: the registry answered %d %s to %s; the checkpoint is on this node, but a pod restores it only if the registry lets its credentials read it",
				errdefs.ErrPermissionDenied, ns, pod, d, te.StatusCode, http.StatusText(te.StatusCode), credentialWord(cred))
		}
		if errors.Is(err, errDigest) || errors.Is(err, errManifestTooLarge) {
			return fmt.Errorf("%w: verifying pod %s/%s may read %s: %v", errdefs.ErrFailedPrecondition, ns, pod, d, err)
		}
		return fmt.Errorf("%w: verifying pod %s/%s may read %s with the registry: %v", errdefs.ErrUnavailable, ns, pod, d, err)
	}
	p.recordAccess(dir, repo.Name(), cred)
	p.cfg.Log.Info("checkpoint: the registry lets a pod read a pulled checkpoint; recorded", "ref", d.String(), "dir", dirName,
		"pod", ns+"/"+pod, "credentials", credentialWord(cred))
	return nil
}

// refusal reports whether err is the registry refusing a request to the
// credentials it was made with: 401, 403, or 404 (which registries answer
// for a private repository the credentials may not read).
func refusal(err error) bool {
	te := (*transport.Error)(nil)
	return errors.As(err, &te) && (te.StatusCode == http.StatusUnauthorized ||
		te.StatusCode == http.StatusForbidden || te.StatusCode == http.StatusNotFound)
}

// credentialWord says, in an error or log, which credentials were used.
func credentialWord(c podCredential) string {
	if c.fromPod() {
		return "the pod's imagePullSecrets"
	}
	return "the node's credentials (the pod's imagePullSecrets name none for the registry)"
}

// keychains are the pod's own keychain (nil without PodKeychain) and the
// one a request uses: the pod's, then the node's.
func (p *RestorePuller) keychains(ctx context.Context, ns, pod, uid string) (podKC, kc authn.Keychain, err error) {
	node, err := LoadKeychain(p.cfg.NodeAuthFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the node's registry credentials: %v", errdefs.ErrFailedPrecondition, err)
	}
	if p.cfg.PodKeychain == nil {
		return nil, node, nil
	}
	podKC, err = p.cfg.PodKeychain(ctx, ns, pod, uid)
	if err != nil {
		return nil, nil, err
	}
	return podKC, authn.NewMultiKeychain(podKC, node), nil
}
