// Package ckptrouter routes PodCheckpoint objects to the node that runs
// their source pod: it sets the label checkpoint.cri-shim.io/node, which is
// all each node's shim watches, so that a node receives only the objects of
// its own pods and never re-lists when its pods change
// (docs/podcheckpoint.md, "Routing"). It is the cluster-level part of
// cri-shim (`cri-shim router`): one watch of the bound pods of the cluster
// and one of the PodCheckpoints, as a controller manager's controllers
// hold; every write it makes is idempotent, so two routers running at once
// agree.
package ckptrouter

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/cri-shim/cri-shim/internal/backoff"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// LabelFunc sets NodeLabel of the object ns/name to value, if the object
// is still at resourceVersion (a merge patch of its labels carrying the
// version, so the API server answers Conflict when it changed: a node may
// have held it meanwhile).
type LabelFunc func(ctx context.Context, ns, name, resourceVersion, value string) error

// Router keeps every PodCheckpoint that no node holds yet labelled with the
// node of its source pod.
type Router struct {
	pods, objects cache.SharedIndexInformer
	label         LabelFunc
	queue         workqueue.TypedRateLimitingInterface[string]
	log           *slog.Logger
	written       *prometheus.CounterVec
}

// bySourcePod indexes objects by the key of their source pod.
const bySourcePod = "sourcePod"

// New builds a router over pods (list and watch of the bound pods of all
// namespaces: field selector spec.nodeName!=) and objects (list and watch
// of every PodCheckpoint).
func New(pods, objects cache.ListerWatcher, label LabelFunc, log *slog.Logger) *Router {
	r := &Router{
		pods:    cache.NewSharedIndexInformer(pods, &corev1.Pod{}, 0, cache.Indexers{}),
		objects: cache.NewSharedIndexInformer(objects, &cpv1.PodCheckpoint{}, 10*time.Minute, cache.Indexers{bySourcePod: sourcePodKey}),
		label:   label,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(backoff.RetryLimiter(time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "ckptrouter"}),
		log: log,
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_router_label_writes_total",
			Help: "Writes of the node label of PodCheckpoint objects, by result (ok, error).",
		}, []string{"result"}),
	}
	// The router keeps of a pod only what routing reads: 15,000 pods
	// cost it a few MB.
	_ = r.pods.SetTransform(func(o any) (any, error) {
		if p, ok := o.(*corev1.Pod); ok {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
				ResourceVersion: p.ResourceVersion}, Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}}, nil
		}
		return o, nil
	})
	_, _ = r.objects.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.enqueue,
		UpdateFunc: func(_, o any) { r.enqueue(o) },
	})
	_, _ = r.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: r.podChanged,
		UpdateFunc: func(old, o any) {
			if op, ok := old.(*corev1.Pod); !ok || op.Spec.NodeName != o.(*corev1.Pod).Spec.NodeName || op.UID != o.(*corev1.Pod).UID {
				r.podChanged(o)
			}
		},
		DeleteFunc: r.podChanged,
	})
	return r
}

// Synced says whether both watches have listed (the router's health).
func (r *Router) Synced() bool { return r.pods.HasSynced() && r.objects.HasSynced() }

// Collectors are the router's metrics.
func (r *Router) Collectors() []prometheus.Collector { return []prometheus.Collector{r.written} }

// Run routes with workers goroutines until ctx ends.
func (r *Router) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for _, inf := range []cache.SharedIndexInformer{r.pods, r.objects} {
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
	}
	defer wg.Wait()
	defer r.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), r.pods.HasSynced, r.objects.HasSynced) {
		return
	}
	r.log.Info("router: pods and PodCheckpoints listed", "pods", len(r.pods.GetStore().ListKeys()), "objects", len(r.objects.GetStore().ListKeys()))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
}

// next routes one queued object; false once the queue is shut down.
func (r *Router) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	if err := r.route(ctx, key); err != nil {
		if ctx.Err() != nil {
			return true // stopping: the queue is shut down next
		}
		r.written.WithLabelValues("error").Inc()
		lvl := slog.LevelWarn
		if apierrors.IsConflict(err) {
			lvl = slog.LevelInfo // changed meanwhile: routed again from its new version
		}
		r.log.Log(ctx, lvl, "router: labelling a PodCheckpoint failed; retrying with backoff", "object", key, "err", err)
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// route labels the object key with its source pod's node, when no node
// holds it yet and the pod is bound. An object whose pod is not bound (or
// not created) yet waits for the pod's event; one a node holds is that
// node's (its status.nodeName watch), whatever its pod does later.
func (r *Router) route(ctx context.Context, key string) error {
	o, ok, err := r.objects.GetStore().GetByKey(key)
	if err != nil || !ok {
		return err
	}
	pc := o.(*cpv1.PodCheckpoint)
	if pc.Spec.SourcePodName == "" || pc.Status.NodeName != "" || pc.DeletionTimestamp != nil {
		return nil
	}
	po, ok, err := r.pods.GetStore().GetByKey(pc.Namespace + "/" + pc.Spec.SourcePodName)
	if err != nil || !ok {
		return err
	}
	want := cpv1.NodeLabelValue(po.(*corev1.Pod).Spec.NodeName)
	if pc.Labels[cpv1.NodeLabel] == want {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r.label(ctx, pc.Namespace, pc.Name, pc.ResourceVersion, want); err != nil {
		return err
	}
	r.written.WithLabelValues("ok").Inc()
	r.log.Info("router: PodCheckpoint routed", "object", key, "pod", pc.Spec.SourcePodName, "node", want)
	return nil
}

func (r *Router) enqueue(o any) {
	if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
		r.queue.Add(k)
	}
}

// podChanged queues the objects that name the pod.
func (r *Router) podChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	objs, _ := r.objects.GetIndexer().ByIndex(bySourcePod, p.Namespace+"/"+p.Name)
	for _, obj := range objs {
		r.enqueue(obj)
	}
}

func sourcePodKey(o any) ([]string, error) {
	pc, ok := o.(*cpv1.PodCheckpoint)
	if !ok || pc.Spec.SourcePodName == "" {
		return nil, nil
	}
	return []string{pc.Namespace + "/" + pc.Spec.SourcePodName}, nil
}
