package podcheckpoint

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Conn is the shim's API connection (internal/kubeapi's Client): ready once
// the node's kubeconfig is loaded, which may be long after the shim starts.
type Conn interface {
	Ready() <-chan struct{}
	Clientset() kubernetes.Interface
	REST() *rest.Config
}

// Run waits for the API connection, then reconciles the PodCheckpoints of
// node until ctx ends. It never holds up the shim: it runs beside the CRI
// server and only its own goroutines wait on the API server.
func Run(ctx context.Context, conn Conn, node, root string, ckpt Checkpointer, rt Runtime, log *slog.Logger) {
	log = log.With("component", "podcheckpoint")
	select {
	case <-ctx.Done():
		return
	case <-conn.Ready():
	}
	c, err := NewClient(conn.REST())
	if err != nil {
		log.Error("PodCheckpoint objects are not reconciled", "err", err)
		return
	}
	r := NewReconciler(Config{Node: node, Root: root, DefaultTimeout: 10 * time.Minute},
		ckpt, rt, c, PodGetter{Clientset: conn.Clientset()}, log)
	go NewWatches(c, rt, r, node, log).Run(ctx)
	r.Run(ctx)
}
