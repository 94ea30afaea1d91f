package podcheckpoint

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Every PodCheckpoint list and watch a node makes is selected by the node's
// name: its status.nodeName field or its routing label. Nothing else
// (neither its pods nor their names) enters a selector, so a change of the
// node's pods restarts no watch.
func TestWatchesAreSelectedByTheNodeAlone(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		queries = append(queries, req.URL.Query().Get("fieldSelector")+"|"+req.URL.Query().Get("labelSelector"))
		mu.Unlock()
		if req.URL.Query().Get("watch") == "true" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-req.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"apiVersion":"checkpoint.cri-shim.io/v1alpha1","kind":"PodCheckpointList","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	w := NewWatches(c, e.r, "node-1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); srv.CloseClientConnections(); <-done }()

	allowed := map[string]bool{"status.nodeName=node-1|": true, "|checkpoint.cri-shim.io/node=node-1": true}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		seen := map[string]bool{}
		for _, q := range queries {
			if !allowed[q] {
				t.Fatalf("a request selected %q", q)
			}
			seen[q] = true
		}
		mu.Unlock()
		if len(seen) == len(allowed) {
			break // both informers listed (or began a watch list)
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests %v, want one for each of %v", strings.Join(queries, ", "), allowed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An object that leaves one watch while the other still has it (held by
// this node, and routed away) is still known to the reconciler; once
// neither has it, it is forgotten.
func TestForgottenOnlyWhenNeitherWatchHasIt(t *testing.T) {
	e := newEnv(t)
	w := &Watches{r: e.r, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	held, routed := fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource()
	hi, ri := w.informerOn(held), w.informerOn(routed)
	w.stores = []cache.Store{hi.GetStore(), ri.GetStore()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go hi.RunWithContext(ctx)
	go ri.RunWithContext(ctx)
	pc := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cp", UID: "u1"}}
	pc.Status.NodeName = "node-1"
	held.Add(pc.DeepCopy())
	routed.Add(pc.DeepCopy())
	known := func() bool { return e.r.get(key("ns", "cp")) != nil }
	waitFor(t, "both watches have it", func() bool {
		_, a, _ := hi.GetStore().GetByKey("ns/cp")
		_, b, _ := ri.GetStore().GetByKey("ns/cp")
		return a && b && known()
	})
	routed.Delete(pc.DeepCopy())
	// The routed watch's handler takes its notifications in order: once it
	// has seen an object added after the delete, it has handled the delete.
	after := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "after", UID: "u2"}}
	routed.Add(after)
	waitFor(t, "the routed watch's handler past the delete", func() bool { return e.r.get(key("ns", "after")) != nil })
	if !known() {
		t.Fatal("forgotten although the held watch still has it")
	}
	held.Delete(pc.DeepCopy())
	waitFor(t, "forgotten once neither watch has it", func() bool { return !known() })
}
