package ociartifact

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// sourceCheckTimeout bounds one CheckSource (the pod's secrets and one
// manifest request).
const sourceCheckTimeout = 30 * time.Second

// SourceInfo is what a pod checkpoint's image index says of it: its
// annotations, which a pull checks against the checkpoint's manifest.json.
type SourceInfo struct {
	// Digest is the index's digest, as the registry served it.
	Digest string
	// PodNamespace, PodName and PodUID name the pod it was taken of.
	PodNamespace, PodName, PodUID string
	// CheckpointedAt is when it was taken (zero when not given).
	CheckpointedAt time.Time
	// Containers are the captured containers, in restore order.
	Containers []string
}

// CheckSource resolves ref, a PodCheckpoint's spec.sourceImage, as a
// restore of pod ns/pod (sandbox UID uid) from it would, and reads only its
// image index: one manifest GET of at most 1 MiB, no blob. The reference
// passes ParseRestoreRef (a repository this node's allow-list lets ns use,
// a sha256 digest) before any connection; credentials are the pod's image
// pull secrets, then the node's; a checkpoint of a namespace ns may not
// restore from is refused with layout.ErrForeignCheckpoint and nothing of it
// returned. Errors are of an errdefs class: InvalidArgument,
// PermissionDenied (not allow-listed for ns), NotFound (nothing ns may
// restore there: see notReadable), FailedPrecondition (not a pod checkpoint
// this build restores) and Unavailable (registry or API server not
// answering: try again).
//
// The answers are what a tenant learns of a repository: the registry's
// 401, 403 and 404 are one answer, and what only the node's credentials
// read is told apart from those no further (a foreign namespace's
// checkpoint, no pod checkpoint), so an object cannot probe which digests
// another namespace's repositories hold.
func (p *RestorePuller) CheckSource(ctx context.Context, ns, pod, uid, ref string) (SourceInfo, error) {
	d, allowed, err := ParseRestoreRef(ref, ns, p.cfg.Registries)
	if err != nil {
		return SourceInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, sourceCheckTimeout)
	defer cancel()
	podKC, kc, err := p.keychains(ctx, ns, pod, uid)
	if err != nil {
		if !errdefs.IsUnavailable(err) {
			// The restoring pod's trouble (replaced, moved), not the image's.
			err = fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		}
		return SourceInfo{}, err
	}
	// What is read with the node's own credentials, not the pod's nor
	// anonymously, is what the tenant may not read itself.
	nodeRead := readsWithNode(podKC, kc, d.Context())
	refuse := func(err error) (SourceInfo, error) {
		if nodeRead {
			return SourceInfo{}, notReadable(ref)
		}
		return SourceInfo{}, err
	}
	reg := Registry{Keychain: kc, CAFile: allowed.CAFile, PlainHTTP: allowed.PlainHTTP, Transport: p.cfg.Transport}
	r, opts, err := reg.connect(ctx, d.String())
	if err != nil {
		return SourceInfo{}, fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, ref, err)
	}
	desc, err := getByDigest(r, d, opts)
	if err != nil {
		if errors.Is(err, errDigest) {
			return refuse(fmt.Errorf("%w: %s: %v", errdefs.ErrFailedPrecondition, ref, err))
		}
		return SourceInfo{}, registryError(ref, err)
	}
	if desc.MediaType != types.OCIImageIndex {
		return refuse(fmt.Errorf("%w: %s: %v: media type %q, want an OCI image index", errdefs.ErrFailedPrecondition, ref, errNotCheckpoint, desc.MediaType))
	}
	idx, err := parseIndex(desc.Manifest)
	if err != nil {
		return refuse(fmt.Errorf("%w: %s: %v", errdefs.ErrFailedPrecondition, ref, err))
	}
	info, err := sourceInfo(idx)
	if err != nil {
		return refuse(fmt.Errorf("%w: %s: %v", errdefs.ErrFailedPrecondition, ref, err))
	}
	info.Digest = desc.Digest.String()
	if !p.cfg.RestoreAllowed(info.PodNamespace, ns) {
		return refuse(fmt.Errorf("%w: %s", layout.ErrForeignCheckpoint, ref))
	}
	return info, nil
}

// readsWithNode reports whether kc (the pod's keychain podKC, then the
// node's) reads repo with the node's credentials: the pod's secrets have
// none for it and the node's are not anonymous.
func readsWithNode(podKC, kc authn.Keychain, repo name.Repository) bool {
	if c, err := credentialOf(podKC, repo); err == nil && c.fromPod() {
		return false
	}
	a, err := kc.Resolve(repo)
	return err == nil && a != authn.Anonymous
}

// notReadable is the one answer for a reference a tenant cannot tell apart
// further: the registry answered 401, 403 or 404, or only the node's
// credentials read something there that the namespace may not restore.
func notReadable(ref string) error {
	return fmt.Errorf("%w: %s: no pod checkpoint this namespace may restore is readable there: the repository has no such digest, "+
		"the registry refused the credentials tried (the restoring pod's image pull secrets, then the node's), "+
		"or what it serves there is no checkpoint of a namespace this one may restore from", errdefs.ErrNotFound, ref)
}

// getByDigest GETs the manifest or index r names by digest d, with opts
// (Registry.connect's: plainGuard caps the body at maxIndexBytes, so
// nothing larger is read), and checks the bytes against d. A failed request
// returns go-containerregistry's error (a *transport.Error for a refusal,
// errManifestTooLarge for an oversized body); bytes that do not match d,
// errDigest.
func getByDigest(r name.Reference, d name.Digest, opts []remote.Option) (*remote.Descriptor, error) {
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, err
	}
	if desc.Digest.String() != d.DigestStr() {
		return nil, fmt.Errorf("the registry served %s: %w", desc.Digest, errDigest)
	}
	if err := checkRaw(desc.Manifest, desc.Digest, int64(len(desc.Manifest))); err != nil {
		return nil, err
	}
	return desc, nil
}

// sourceInfo reads a checked index's annotations, which are hostile input:
// names must have Kubernetes' forms, since they go into an object's status.
func sourceInfo(idx *pulledIndex) (SourceInfo, error) {
	a := idx.raw.Annotations
	info := SourceInfo{PodNamespace: a[AnnotationPodNamespace], PodName: a[AnnotationPodName], PodUID: a[AnnotationPodUID]}
	if errs := validation.IsDNS1123Label(info.PodNamespace); len(errs) > 0 {
		return SourceInfo{}, fmt.Errorf("annotation %s %q: %s", AnnotationPodNamespace, info.PodNamespace, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(info.PodName); len(errs) > 0 {
		return SourceInfo{}, fmt.Errorf("annotation %s %q: %s", AnnotationPodName, info.PodName, errs[0])
	}
	if len(info.PodUID) > 128 || strings.ContainsFunc(info.PodUID, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return SourceInfo{}, fmt.Errorf("annotation %s is not a UID", AnnotationPodUID)
	}
	if s := a[AnnotationCheckpointedAt]; s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return SourceInfo{}, fmt.Errorf("annotation %s: %v", AnnotationCheckpointedAt, err)
		}
		info.CheckpointedAt = t
	}
	// The descriptors' names are checked (parseIndex); the annotation gives
	// their restore order and must name the same containers.
	listed := strings.Split(a[AnnotationContainers], ",")
	if len(listed) != len(idx.containers) {
		return SourceInfo{}, fmt.Errorf("annotation %s lists %d containers, the index %d", AnnotationContainers, len(listed), len(idx.containers))
	}
	have := map[string]bool{}
	for _, c := range idx.containers {
		have[c.name] = true
	}
	for _, n := range listed {
		if !have[n] {
			return SourceInfo{}, fmt.Errorf("annotation %s names %q, which the index does not hold", AnnotationContainers, n)
		}
		delete(have, n)
		info.Containers = append(info.Containers, n)
	}
	return info, nil
}

// registryError classifies a failed manifest request: 401, 403 and 404 are
// one answer (notReadable), the registry's words left out, since they could
// tell which one it was.
func registryError(ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound, http.StatusUnauthorized, http.StatusForbidden:
			return notReadable(ref)
		}
	}
	if errors.Is(err, errManifestTooLarge) {
		return fmt.Errorf("%w: %s: %v", errdefs.ErrFailedPrecondition, ref, err)
	}
	return fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, ref, err)
}
