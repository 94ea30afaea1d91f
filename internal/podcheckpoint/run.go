package podcheckpoint

import (
	"context"
	"errors"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
)

// Conn is the shim's API connection (internal/kubeapi's Client): ready once
// the node's kubeconfig is loaded, which may be long after the shim starts.
type Conn interface {
	Ready() <-chan struct{}
	Resources() kubeapi.Resources
	REST() *rest.Config
}

// Run waits for the API connection, then reconciles the PodCheckpoints of
// node until ctx ends, pushes those with spec.export through exp (nil: they
// fail), checks the spec.sourceImage of objects its pods restore from
// through src (nil: the node has no registries), and answers restores (may
// be nil) from what it watches. It never holds up the shim: it runs beside
// the CRI server and only its own goroutines wait on the API server.
func Run(ctx context.Context, conn Conn, node, root string, ckpt Checkpointer, rt Runtime, restores *Restores, exp Exporter, src SourceChecker, ev EventSink, log *slog.Logger) {
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
	pods := podInformer(conn.Resources(), node)
	go pods.Run(ctx.Done())
	r := NewReconciler(Config{Node: node, Root: root, DefaultTimeout: 10 * time.Minute, Exporter: exp, Sources: src},
		ckpt, rt, c, informerPods{pods}, ev, log)
	if restores != nil {
		restores.connect(&restoreView{object: r.Lookup, pod: cachedPod(pods.GetStore()), get: c.Get, template: r.template, source: r.SourceRestore})
	}
	go NewWatches(c, r, node, log).Run(ctx)
	r.Run(ctx)
}

// podInformer caches the pods bound to node (the kubelet's own watch, and
// what the Node authorizer lets a node list), less their managed fields.
func podInformer(res kubeapi.Resources, node string) cache.SharedIndexInformer {
	lw := kubeapi.PodsListWatch(res, fields.OneTermEqualSelector("spec.nodeName", node).String())
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	_ = inf.SetTransform(func(o any) (any, error) {
		if p, ok := o.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return o, nil
	})
	return inf
}

// informerPods reads the node's pods from its pod informer: the source pod
// of an object this node checkpoints runs on this node, so once the
// informer has synced it holds the pod, and reading it costs the API server
// nothing.
type informerPods struct{ inf cache.SharedIndexInformer }

func (p informerPods) GetPod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if !p.inf.HasSynced() {
		return nil, errors.New("the node's pods are not listed yet")
	}
	if pod := cachedPod(p.inf.GetStore())(ns, name); pod != nil {
		return pod, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
}

func cachedPod(s cache.Store) func(ns, name string) *corev1.Pod {
	return func(ns, name string) *corev1.Pod {
		o, ok, err := s.GetByKey(key(ns, name))
		if err != nil || !ok {
			return nil
		}
		p, _ := o.(*corev1.Pod)
		return p
	}
}
