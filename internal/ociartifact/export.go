package ociartifact

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
)

// ParseExportRef parses where a PodCheckpoint's spec.export pushes, which a
// namespace controls: host[:port]/repository[:tag] (no digest: the push
// makes it), with the registry spelt out and the repository one allow lets
// namespace ns use.
func ParseExportRef(s, ns string, allow []Allowed) (name.Tag, Allowed, error) {
	if len(s) > maxRefLen {
		return name.Tag{}, Allowed{}, fmt.Errorf("%w: image %q of %d characters, at most %d", errdefs.ErrInvalidArgument, s, len(s), maxRefLen)
	}
	host, _, ok := strings.Cut(s, "/")
	if !ok || !(strings.ContainsAny(host, ".:") || host == "localhost") || strings.Contains(s, "@") {
		return name.Tag{}, Allowed{}, fmt.Errorf("%w: image %q must be host[:port]/repository[:tag]", errdefs.ErrInvalidArgument, s)
	}
	full := s
	if !strings.Contains(s[strings.LastIndex(s, "/")+1:], ":") {
		full += ":latest" // as a push without a tag is named
	}
	t, err := name.NewTag(full, name.StrictValidation)
	if err != nil {
		return name.Tag{}, Allowed{}, fmt.Errorf("%w: image %q: %v", errdefs.ErrInvalidArgument, s, err)
	}
	if err := checkRepository(s, t.Context()); err != nil {
		return name.Tag{}, Allowed{}, err
	}
	a, err := allowed(s, host, t.Context(), ns, allow)
	return t, a, err
}

// Exporter pushes PodCheckpoints' data (spec.export) for the node.
type Exporter struct {
	Registries []Allowed
	// Resources is the node's API connection (secrets); nil: none yet.
	Resources func() kubeapi.Resources
	Node      string
	Timeout   time.Duration
	Transport http.RoundTripper // tests
}

// Export pushes the checkpoint in dir to image and returns the pushed
// reference by digest and the digest. With secret, the push uses that
// kubernetes.io/dockerconfigjson secret of namespace ns, which the source
// pod ns/pod (UID uid) must list in imagePullSecrets, read as the node;
// without, it is anonymous, and only where the allow-list's entry says
// anonymous_push: the node's own credentials would let anyone who may
// create a PodCheckpoint write wherever the node may, and an anonymous push
// comes from the node's address, which a registry may trust.
func (e *Exporter) Export(ctx context.Context, ns, pod, uid, secret, image, dir string) (string, string, error) {
	t, a, err := ParseExportRef(image, ns, e.Registries)
	if err != nil {
		return "", "", err
	}
	kc := authsKeychain{}
	if secret == "" && !a.AnonymousPush {
		return "", "", fmt.Errorf("%w: spec.export names no secretName, and this node's [checkpoint] registries entry %q does not allow anonymous pushes (anonymous_push); name a kubernetes.io/dockerconfigjson secret the source pod lists in imagePullSecrets", errdefs.ErrPermissionDenied, a.Host)
	}
	if secret != "" {
		if kc, err = e.secret(ctx, ns, pod, uid, secret); err != nil {
			return "", "", err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, e.Timeout)
	defer cancel()
	p, err := Push(ctx, dir, t.String(), Registry{Keychain: kc, CAFile: a.CAFile, PlainHTTP: a.PlainHTTP, Transport: e.Transport}, nil)
	if err != nil {
		return "", "", fmt.Errorf("pushing to %s: %w", t, err)
	}
	return p.Ref, p.Digest.String(), nil
}

// secret reads the export's credentials: a secret the source pod lists.
func (e *Exporter) secret(ctx context.Context, ns, pod, uid, secret string) (authsKeychain, error) {
	var res kubeapi.Resources
	if e.Resources != nil {
		res = e.Resources()
	}
	if res == nil {
		return nil, fmt.Errorf("%w: reading secret %s/%s: the node's API connection is not up yet", errdefs.ErrUnavailable, ns, secret)
	}
	rctx, cancel := context.WithTimeout(ctx, apiReadTimeout)
	defer cancel()
	p, err := res.GetPod(rctx, ns, pod)
	if err != nil {
		return nil, fmt.Errorf("reading source pod %s/%s: %w", ns, pod, err)
	}
	if string(p.UID) != uid || p.Spec.NodeName != e.Node {
		return nil, fmt.Errorf("%w: source pod %s/%s is no longer the checkpointed one on this node, so its secret %q cannot be read", errdefs.ErrFailedPrecondition, ns, pod, secret)
	}
	if !slices.Contains(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: secret}) {
		return nil, fmt.Errorf("%w: spec.export.secretName %q is not in the source pod's imagePullSecrets (a node reads only the secrets of its pods)", errdefs.ErrFailedPrecondition, secret)
	}
	s, err := res.GetSecret(rctx, ns, secret)
	if err != nil {
		return nil, fmt.Errorf("reading secret %s/%s: %w", ns, secret, err)
	}
	if s.Type != corev1.SecretTypeDockerConfigJson {
		return nil, fmt.Errorf("%w: secret %s/%s is of type %s, not %s", errdefs.ErrFailedPrecondition, ns, secret, s.Type, corev1.SecretTypeDockerConfigJson)
	}
	auths, err := ParseDockerConfigJSON(s.Data[corev1.DockerConfigJsonKey])
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", ns, secret, err)
	}
	return auths, nil
}
