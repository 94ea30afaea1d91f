package podcheckpoint

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/cri-shim/cri-shim/internal/podtable"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Watches feeds the reconciler the PodCheckpoints this node has to do with,
// and no others (docs/podcheckpoint.md, "What a node watches"):
//
//   - held: status.nodeName=<node> (a selectable field of the CRD): the
//     objects this node holds, for their finalizer and for restores by name.
//   - sources: label checkpoint.cri-shim.io/source-pod in (keys
//     "<namespace>.<name>" of the pods whose sandboxes are ready on this
//     node), restarted when that set changes; none while the node runs no
//     pod.
type Watches struct {
	client *Client
	rt     Runtime
	r      *Reconciler
	node   string
	log    *slog.Logger
	// errMu and lastErr keep watchError to one log line per cause.
	errMu   sync.Mutex
	lastErr string
	// pollEvery paces the look at the node's sandboxes (the runtime, not the API).
	pollEvery time.Duration
}

// NewWatches builds the watches of node for r.
func NewWatches(c *Client, rt Runtime, r *Reconciler, node string, log *slog.Logger) *Watches {
	return &Watches{client: c, rt: rt, r: r, node: node, log: log, pollEvery: 2 * time.Second}
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
	go heldInf.Run(ctx.Done())
	go w.sweepOrphans(ctx, heldInf)

	var keys []string
	var stop context.CancelFunc = func() {}
	defer func() { stop() }()
	t := time.NewTicker(w.pollEvery)
	defer t.Stop()
	for {
		if now := w.localKeys(); !slices.Equal(now, keys) {
			stop()
			keys = now
			var src cache.SharedIndexInformer
			var srcCtx context.Context
			stop, src, srcCtx = w.sources(ctx, keys)
			go w.pruneAfterSync(srcCtx, heldInf, src)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sources runs the informer of the objects whose source pods are keys
// until the returned function is called; none (nil) for no keys.
// It also returns the context the informer runs in.
func (w *Watches) sources(ctx context.Context, keys []string) (context.CancelFunc, cache.SharedIndexInformer, context.Context) {
	if len(keys) == 0 {
		return func() {}, nil, ctx
	}
	sel := sourceSelector(keys)
	ctx, cancel := context.WithCancel(ctx)
	inf := w.informer(func(o *metav1.ListOptions) { o.LabelSelector = sel })
	go inf.Run(ctx.Done())
	return cancel, inf, ctx
}

// pruneAfterSync makes the reconciler forget the objects that neither held
// nor src (the sources informer just started; nil for none) holds, once
// both have synced (ctx: src's, which ends when src is replaced): the objects of a source-pod set the node no longer has
// are not kept (their watch was cancelled), so that restore by name never
// answers from a copy no watch updates any more. An object the node still
// has to do with is in one of the two stores.
func (w *Watches) pruneAfterSync(ctx context.Context, held, src cache.SharedIndexInformer) {
	synced := []cache.InformerSynced{held.HasSynced}
	if src != nil {
		synced = append(synced, src.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return // stopped (ctx, or src replaced: its successor prunes)
	}
	stores := []cache.Store{held.GetStore()}
	if src != nil {
		stores = append(stores, src.GetStore())
	}
	n := w.r.prune(func(ns, name string) bool {
		for _, st := range stores {
			if _, ok, _ := st.GetByKey(ns + "/" + name); ok {
				return true
			}
		}
		return false
	})
	if n > 0 {
		w.log.Info("podcheckpoint: forgot objects no watch of the node holds any more", "objects", n)
	}
}

// sourceSelector selects the objects whose source-pod key is one of keys.
func sourceSelector(keys []string) string {
	req, err := labels.NewRequirement(cpv1.SourcePodLabel, selection.In, keys)
	if err != nil {
		// A key is always a valid label value (SourcePodKey); never here.
		return cpv1.SourcePodLabel + " in (" + strings.Join(keys, ",") + ")"
	}
	return labels.NewSelector().Add(*req).String()
}

// localKeys are the sorted, distinct source-pod keys of the pods whose
// sandboxes are ready on this node.
func (w *Watches) localKeys() []string {
	seen := map[string]bool{}
	var keys []string
	for _, sb := range w.rt.List(func(s *podtable.Sandbox) bool { return s.Ready }) {
		k := cpv1.SourcePodKey(sb.Metadata.GetNamespace(), sb.Metadata.GetName())
		if k != "" && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// informer lists and watches PodCheckpoints of all namespaces as opts
// selects, feeding the reconciler. Its periodic resync requeues every
// object it holds (a checkpoint waiting for its pod's containers, a status
// write that failed).
func (w *Watches) informer(opts func(*metav1.ListOptions)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			opts(&o)
			return w.client.List(ctx, "", o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			opts(&o)
			return w.client.Watch(ctx, "", o)
		},
	}
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
			if pc, ok := o.(*cpv1.PodCheckpoint); ok {
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
