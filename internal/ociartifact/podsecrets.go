package ociartifact

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
)

// apiReadTimeout bounds each read of the pod and its secrets.
const apiReadTimeout = 10 * time.Second

// maxPullSecrets bounds the imagePullSecrets names read for one pod: the
// first this many distinct names, the rest ignored (a pod spec may name
// thousands, each a GET the node's token bucket pays for).
const maxPullSecrets = 16

// PodKeychain returns the credentials of the image pull secrets of pod
// ns/name whose sandbox has UID uid, read as node: the Node authorizer lets a
// node read the secrets its pods reference, image pull secrets included
// (kubernetes plugin/pkg/auth/authorizer/node/graph.go, AddPod, through
// pkg/api/v1/pod/util.go, VisitPodSecretNames), and nothing else. Secrets
// that are missing or not of type kubernetes.io/dockerconfigjson are
// skipped, as the kubelet skips them; an API server that does not answer is
// an Unavailable error (the kubelet retries), never a wait beyond
// apiReadTimeout per read. The secrets' names are deduplicated and capped at
// maxPullSecrets; secrets (nil: none) answers reads made within its TTL,
// not-found ones included.
func PodKeychain(ctx context.Context, res kubeapi.Resources, secrets *SecretCache, node, ns, pod, uid string, log *slog.Logger) (authn.Keychain, error) {
	// The pod's namespace takes its turn in the node's token bucket.
	ctx = kubeapi.ForNamespace(ctx, ns)
	if res == nil {
		return nil, fmt.Errorf("%w: reading pod %s/%s's imagePullSecrets: the node's API connection is not up yet", errdefs.ErrUnavailable, ns, pod)
	}
	rctx, cancel := context.WithTimeout(ctx, apiReadTimeout)
	p, err := res.GetPod(rctx, ns, pod)
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: pod %s/%s is not in the API server (yet)", errdefs.ErrUnavailable, ns, pod)
	case err != nil:
		return nil, fmt.Errorf("%w: reading pod %s/%s's imagePullSecrets from the API server: %v", errdefs.ErrUnavailable, ns, pod, err)
	case string(p.UID) != uid:
		return nil, fmt.Errorf("%w: pod %s/%s in the API server has UID %s, the sandbox's is %s", errdefs.ErrFailedPrecondition, ns, pod, p.UID, uid)
	case p.Spec.NodeName != node:
		return nil, fmt.Errorf("%w: pod %s/%s is bound to node %q, not %q", errdefs.ErrFailedPrecondition, ns, pod, p.Spec.NodeName, node)
	}
	kc := authsKeychain{}
	for i, name := range pullSecretNames(p) {
		if i == maxPullSecrets {
			log.Warn("checkpoint: pod names more image pull secrets than are read; the rest ignored", "pod", ns+"/"+pod, "read", maxPullSecrets)
			break
		}
		ref := corev1.LocalObjectReference{Name: name}
		s, err := secrets.get(ctx, res, ns, ref.Name)
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
			log.Warn("checkpoint: image pull secret not readable; skipped", "pod", ns+"/"+pod, "secret", ref.Name, "err", err)
			continue
		case err != nil:
			return nil, fmt.Errorf("%w: reading secret %s/%s from the API server: %v", errdefs.ErrUnavailable, ns, ref.Name, err)
		case s.Type != corev1.SecretTypeDockerConfigJson:
			log.Warn("checkpoint: image pull secret is not of type kubernetes.io/dockerconfigjson; skipped", "pod", ns+"/"+pod, "secret", ref.Name, "type", s.Type)
			continue
		}
		auths, err := ParseDockerConfigJSON(s.Data[corev1.DockerConfigJsonKey])
		if err != nil {
			log.Warn("checkpoint: image pull secret unreadable; skipped", "pod", ns+"/"+pod, "secret", ref.Name, "err", err)
			continue
		}
		for host, a := range auths {
			if _, ok := kc[host]; !ok { // the first secret naming a registry wins
				kc[host] = a
			}
		}
	}
	return kc, nil
}

// pullSecretNames are the distinct non-empty names of p's imagePullSecrets,
// in order, at most maxPullSecrets+1 (the one more says there are more).
func pullSecretNames(p *corev1.Pod) []string {
	var out []string
	for _, ref := range p.Spec.ImagePullSecrets {
		if ref.Name == "" || slices.Contains(out, ref.Name) {
			continue
		}
		if out = append(out, ref.Name); len(out) > maxPullSecrets {
			break
		}
	}
	return out
}
