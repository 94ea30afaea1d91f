package podcheckpoint

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// Provenance of a checkpoint pulled for a restore from an image reference
// ([checkpoint] restore_provenance = "cluster", the default): the image
// index's digest must be one a node of this cluster recorded in the status
// of a PodCheckpoint it exported (status.export.digest; tenants cannot write
// status, deploy/rbac), in the restoring pod's namespace or one it may
// restore from. Bytes anyone could push to an allowed registry are then
// never restored: only what this cluster checkpointed and pushed. The API
// server filters by the CRD's selectable field status.export.digest, one
// LIST per namespace and digest (limit 1), before any byte is fetched.

// provenanceTimeout bounds one look-up.
const provenanceTimeout = 10 * time.Second

// Provenance returns the check, over conn: nil error when a namespace of
// namespaces(ns) (the restoring pod's, then those it may restore from)
// holds a PodCheckpoint whose status.export.digest is digest.
// PermissionDenied when none does; Unavailable while the API connection is
// not ready or the API server does not answer (the pod stays pending, the
// kubelet retries).
func Provenance(conn Conn, namespaces func(ns string) []string) func(ctx context.Context, ns, digest string) error {
	var once sync.Once
	var client *Client
	var clientErr error
	return func(ctx context.Context, ns, digest string) error {
		select {
		case <-conn.Ready():
		default:
			return fmt.Errorf("%w: restore_provenance = \"cluster\": the API server connection is not ready to check that a node of this cluster exported %s", errdefs.ErrUnavailable, digest)
		}
		once.Do(func() { client, clientErr = NewClient(conn.REST()) })
		if clientErr != nil {
			return fmt.Errorf("%w: restore_provenance: %v", errdefs.ErrUnavailable, clientErr)
		}
		ctx, cancel := context.WithTimeout(ctx, provenanceTimeout)
		defer cancel()
		sel := fields.OneTermEqualSelector("status.export.digest", digest).String()
		for _, n := range namespaces(ns) {
			l, err := client.List(ctx, n, metav1.ListOptions{FieldSelector: sel, Limit: 1})
			if err != nil {
				return fmt.Errorf("%w: restore_provenance: looking for the PodCheckpoint that exported %s in namespace %s: %v", errdefs.ErrUnavailable, digest, n, err)
			}
			for _, pc := range l.Items {
				if pc.Status.Export != nil && pc.Status.Export.Digest == digest {
					return nil
				}
			}
		}
		return fmt.Errorf("%w: no PodCheckpoint of namespace %s records exporting %s (status.export.digest): with [checkpoint] restore_provenance = \"cluster\" a pod restores only checkpoints a node of this cluster exported; an operator widens it with restore_provenance = \"any\"",
			errdefs.ErrPermissionDenied, ns, digest)
	}
}
