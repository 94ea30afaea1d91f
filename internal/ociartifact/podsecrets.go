package ociartifact

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
)

// apiReadTimeout bounds each read of the pod and its secrets.
const apiReadTimeout = 10 * time.Second

// PodKeychain returns the credentials of the image pull secrets of pod
// ns/name whose sandbox has UID uid, read as node: the Node authorizer lets a
// node read the secrets its pods reference, image pull secrets included
// (kubernetes plugin/pkg/auth/authorizer/node/graph.go, AddPod, through
// pkg/api/v1/pod/util.go, VisitPodSecretNames), and nothing else. Secrets
// that are missing or not of type kubernetes.io/dockerconfigjson are
// skipped, as the kubelet skips them; an API server that does not answer is
// an Unavailable error (the kubelet retries), never a wait beyond
// apiReadTimeout per read.
func PodKeychain(ctx context.Context, res kubeapi.Resources, node, ns, pod, uid string, log *slog.Logger) (authn.Keychain, error) {
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
	for _, ref := range p.Spec.ImagePullSecrets {
		if ref.Name == "" {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, apiReadTimeout)
		s, err := res.GetSecret(rctx, ns, ref.Name)
		cancel()
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
