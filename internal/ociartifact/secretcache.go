package ociartifact

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
)

// secretTTL is how long a secret read (or found missing, or refused) answers
// again: the kubelet retries a pending pod's sandbox every few seconds, and
// each retry would read its pull secrets anew. A secret changed or created
// meanwhile is seen at most this late.
const secretTTL = 30 * time.Second

// maxCachedSecrets bounds the entries; beyond it the expired go, then all.
const maxCachedSecrets = 1024

// SecretCache remembers the image pull secrets PodKeychain read, by
// namespace and name, for secretTTL. Only answers of the API server are
// kept (a secret, NotFound, Forbidden), never a failure to reach it. A
// pod's keychain is made from the names its own spec lists, so an entry
// answers only for a secret the node may read for that pod too (the Node
// authorizer lets a node read the secrets its pods name). A nil
// *SecretCache reads every time.
type SecretCache struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]cachedSecret
}

type cachedSecret struct {
	s   *corev1.Secret
	err error
	at  time.Time
}

// NewSecretCache makes an empty cache.
func NewSecretCache() *SecretCache {
	return &SecretCache{now: time.Now, m: map[string]cachedSecret{}}
}

// get reads secret ns/name, from the cache while its entry is fresh. The
// secret returned is shared: callers only read it.
func (c *SecretCache) get(ctx context.Context, res kubeapi.Resources, ns, name string) (*corev1.Secret, error) {
	read := func() (*corev1.Secret, error) {
		rctx, cancel := context.WithTimeout(ctx, apiReadTimeout)
		defer cancel()
		return res.GetSecret(rctx, ns, name)
	}
	if c == nil {
		return read()
	}
	k := ns + "/" + name
	c.mu.Lock()
	e, ok := c.m[k]
	c.mu.Unlock()
	if ok && c.now().Sub(e.at) < secretTTL {
		return e.s, e.err
	}
	s, err := read()
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		return s, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.m) >= maxCachedSecrets {
		for k, e := range c.m {
			if now.Sub(e.at) >= secretTTL {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCachedSecrets {
			clear(c.m)
		}
	}
	c.m[k] = cachedSecret{s: s, err: err, at: now}
	return s, err
}
