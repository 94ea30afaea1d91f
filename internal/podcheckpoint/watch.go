package podcheckpoint

import (
	"context"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Watches feeds the reconciler the PodCheckpoints this node has to do with,
// and no others (docs/podcheckpoint.md, "What a node watches"). Both are
// selected by the node's name alone, so neither is ever restarted because
// the node's pods changed:
//
//   - held: status.nodeName=<node> (a selectable field of the CRD): the
//     objects this node holds, for their finalizer and for restores by name.
//   - routed: label checkpoint.cri-shim.io/node=<node>: the objects whose
//     source pod runs on this node, as the router (internal/ckptrouter)
//     labels them. An object the router moves to another node leaves this
//     watch (a delete event), and the reconciler forgets it.
type Watches struct {
	client *Client
	r      *Reconciler
	node   string
	log    *slog.Logger
	// stores are the two watches' caches (set before they run).
	stores []cache.Store
	// errMu and lastErr keep watchError to one log line per cause.
	errMu   sync.Mutex
	lastErr string
}

// NewWatches builds the watches of node for r.
func NewWatches(c *Client, r *Reconciler, node string, log *slog.Logger) *Watches {
	return &Watches{client: c, r: r, node: node, log: log}
}

// Run keeps the watches until ctx ends.
func (w *Watches) Run(ctx context.Context) {
	held := fields.OneTermEqualSelector("status.nodeName", w.node).String()
	heldInf := w.informer(func(o *metav1.ListOptions) { o.FieldSelector = held })
	// An object the node held is gone: its data goes with it at once (the
	// node's finalizer removed it already, unless a user removed the
	// finalizer); the periodic sweep catches what this misses.
	_, _ = heldInf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if pc, ok := o.(*cpv1.PodCheckpoint); ok {
			w.removeData(pc)
		}
	}})
	routed := routedSelector(w.node)
	routedInf := w.informer(func(o *metav1.ListOptions) { o.LabelSelector = routed })
	w.stores = []cache.Store{heldInf.GetStore(), routedInf.GetStore()}
	go w.sweepOrphans(ctx, heldInf)
	go routedInf.RunWithContext(ctx)
	heldInf.RunWithContext(ctx)
}

// watched says whether either watch still has the object key.
func (w *Watches) watched(key string) bool {
	for _, st := range w.stores {
		if _, ok, _ := st.GetByKey(key); ok {
			return true
		}
	}
	return false
}

// routedSelector is the label selector of the objects routed to node.
func routedSelector(node string) string {
	return labels.SelectorFromSet(labels.Set{cpv1.NodeLabel: cpv1.NodeLabelValue(node)}).String()
}

// informer lists and watches PodCheckpoints of all namespaces as opts
// selects, feeding the reconciler. Its periodic resync requeues every
// object it holds (a checkpoint waiting for its pod's containers, a status
// write that failed).
func (w *Watches) informer(opts func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return w.informerOn(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			opts(&o)
			return w.client.List(ctx, "", o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			opts(&o)
			return w.client.Watch(ctx, "", o)
		},
	})
}

// informerOn is informer on lw.
func (w *Watches) informerOn(lw cache.ListerWatcher) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformer(lw, &cpv1.PodCheckpoint{}, time.Minute, cache.Indexers{})
	_ = inf.SetWatchErrorHandlerWithContext(w.watchError)
	observe := func(o any) {
		if pc, ok := o.(*cpv1.PodCheckpoint); ok {
			w.r.Observe(pc)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, o any) { observe(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			// Forgotten once neither watch has it: an object leaves one
			// watch and may stay in the other (held, and routed away).
			if pc, ok := o.(*cpv1.PodCheckpoint); ok && !w.watched(pc.Namespace+"/"+pc.Name) {
				w.r.Forget(pc.Namespace, pc.Name)
			}
		},
	})
	return inf
}

// watchError tells why a PodCheckpoint list or watch failed, once per
// cause: the reflector retries with its own backoff. A cluster without the
// CRD, or without the node's RBAC for it, gets the switch that turns the
// controller off.
func (w *Watches) watchError(_ context.Context, _ *cache.Reflector, err error) {
	msg := err.Error()
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		msg += "; install deploy/crd and deploy/rbac, or set [kubernetes] pod_checkpoints = false"
	}
	w.errMu.Lock()
	repeated := msg == w.lastErr
	w.lastErr = msg
	w.errMu.Unlock()
	if !repeated {
		w.log.Warn("podcheckpoint: listing or watching PodCheckpoint objects failed; retrying with backoff", "err", msg)
	}
}
