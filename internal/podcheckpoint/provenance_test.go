package podcheckpoint

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"k8s.io/client-go/rest"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

type restConn struct {
	ready chan struct{}
	cfg   *rest.Config
}

func (c restConn) Ready() <-chan struct{}       { return c.ready }
func (c restConn) Resources() kubeapi.Resources { return nil }
func (c restConn) REST() *rest.Config           { return c.cfg }

// Issue 28 item 2: a digest is a checkpoint of this cluster when a
// PodCheckpoint of the pod's namespace (or one it may restore from) records
// exporting it in its status; the API server filters by the selectable
// field. Another digest, or one only another namespace exported, is
// PermissionDenied; an API server that does not answer is Unavailable.
func TestProvenance(t *testing.T) {
	const exported = "sha256:" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Path+"?"+r.URL.Query().Get("fieldSelector"))
		l := cpv1.PodCheckpointList{}
		l.APIVersion, l.Kind = cpv1.SchemeGroupVersion.String(), "PodCheckpointList"
		if strings.Contains(r.URL.Path, "/namespaces/team-a/") && r.URL.Query().Get("fieldSelector") == "status.export.digest="+exported {
			pc := cpv1.PodCheckpoint{}
			pc.Name, pc.Namespace = "web-ckpt", "team-a"
			pc.Status.Export = &cpv1.PodCheckpointExportStatus{Image: "reg/x@" + exported, Digest: exported}
			l.Items = append(l.Items, pc)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(l)
	}))
	defer srv.Close()
	ready := make(chan struct{})
	close(ready)
	from := func(ns string) []string {
		if ns == "team-b" {
			return []string{"team-b", "team-a"} // restore_namespace_allow {team-a, team-b}
		}
		return []string{ns}
	}
	check := Provenance(restConn{ready: ready, cfg: &rest.Config{Host: srv.URL}}, from)
	ctx := context.Background()
	if err := check(ctx, "team-a", exported); err != nil {
		t.Fatalf("the exporting namespace: %v", err)
	}
	if err := check(ctx, "team-b", exported); err != nil {
		t.Fatalf("a namespace allowed to restore team-a's: %v", err)
	}
	if err := check(ctx, "team-c", exported); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("another namespace: want PermissionDenied, got %v", err)
	}
	other := "sha256:" + strings.Repeat("c", 64)
	if err := check(ctx, "team-a", other); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a digest no node exported: want PermissionDenied, got %v", err)
	}
	if !strings.Contains(queries[0], "/namespaces/team-a/podcheckpoints?status.export.digest="+exported) {
		t.Fatalf("query %q: want a namespaced LIST filtered by status.export.digest", queries[0])
	}
	srv.Close()
	if err := check(ctx, "team-a", exported); !errdefs.IsUnavailable(err) {
		t.Fatalf("API server down: want Unavailable, got %v", err)
	}
	if err := Provenance(restConn{ready: make(chan struct{}), cfg: &rest.Config{Host: srv.URL}}, from)(ctx, "team-a", exported); !errdefs.IsUnavailable(err) {
		t.Fatalf("connection not ready: want Unavailable, got %v", err)
	}
}
