// Package ckptrouter routes PodCheckpoint objects to the node that runs
// their source pod, or for an object with spec.sourceImage to the node of a
// pod that restores from it: it sets the label checkpoint.cri-shim.io/node,
// which is all each node's shim watches, so that a node receives only the
// objects of its own pods and never re-lists when its pods change
// (docs/podcheckpoint.md, "Routing"). The label is also the node's ticket:
// the admission policy lets a node write only the objects routed to it. It is the cluster-level part of
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
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// LabelFunc routes the object ns/name to node, if the object is still at
// resourceVersion (podcheckpoint.Client.Route: NodeLabel, and
// NodeNameAnnotation for a hashed value, in a merge patch carrying the
// version, so the API server answers Conflict when it changed: a node may
// have held it meanwhile).
type LabelFunc func(ctx context.Context, ns, name, resourceVersion, node string) error

// Router keeps every PodCheckpoint that no node holds yet labelled with the
// node of its source pod, or of a pod restoring from it.
type Router struct {
	pods, objects cache.SharedIndexInformer
	label         LabelFunc
	queue         workqueue.TypedRateLimitingInterface[string]
	log           *slog.Logger
	written       *prometheus.CounterVec
}

// bySourcePod indexes objects by the key of their source pod.
const bySourcePod = "sourcePod"

// byRestoreFrom indexes pods by namespace and the value of their
// restore-from annotation: the key of the object a pod restores from, when
// it names one.
const byRestoreFrom = "restoreFrom"

// New builds a router over pods (list and watch of the bound pods of all
// namespaces: field selector spec.nodeName!=) and objects (list and watch
// of every PodCheckpoint).
func New(pods, objects cache.ListerWatcher, label LabelFunc, log *slog.Logger) *Router {
	r := &Router{
		pods:    cache.NewSharedIndexInformer(pods, &corev1.Pod{}, 0, cache.Indexers{byRestoreFrom: restoreFromKey}),
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
	_ = r.pods.SetTransform(slimPod)
	_, _ = r.objects.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.enqueue,
		UpdateFunc: func(_, o any) { r.enqueue(o) },
	})
	_, _ = r.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: r.podChanged,
		UpdateFunc: func(old, o any) {
			np, _ := o.(*corev1.Pod)
			if op, ok := old.(*corev1.Pod); !ok || np == nil || op.Spec.NodeName != np.Spec.NodeName || op.UID != np.UID ||
				op.Annotations[podspec.RestoreFromKey] != np.Annotations[podspec.RestoreFromKey] {
				if ok {
					r.podChanged(op) // the object it restored from may lose its node
				}
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

// route labels the object key with the node it belongs to (target), when
// it is not labelled so yet. An object whose pod is not bound (or not
// created) yet waits for the pod's event; one a node holds is that node's
// (its status.nodeName watch), whatever its pod does later.
func (r *Router) route(ctx context.Context, key string) error {
	o, ok, err := r.objects.GetStore().GetByKey(key)
	if err != nil || !ok {
		return err
	}
	pc := o.(*cpv1.PodCheckpoint)
	if pc.DeletionTimestamp != nil {
		return nil
	}
	node, why := r.target(pc)
	if node == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r.label(ctx, pc.Namespace, pc.Name, pc.ResourceVersion, node); err != nil {
		return err
	}
	r.written.WithLabelValues("ok").Inc()
	r.log.Info("router: PodCheckpoint routed", "object", key, "node", node, "because", why)
	return nil
}

// target is the node pc is to be routed to, and why, or "" when its
// routing stands: the node of its source pod; for spec.sourceImage the node
// of a bound pod of its namespace that restores from it (the one it is
// routed to while that pod is there, else the least node name, so two
// routers agree); an object a node holds stays with that node, and only one
// held under an earlier release's rules with no label at all is labelled
// with its holder (its ticket: deploy/admission).
func (r *Router) target(pc *cpv1.PodCheckpoint) (string, string) {
	if h := pc.Status.NodeName; h != "" {
		if _, labelled := pc.Labels[cpv1.NodeLabel]; labelled {
			return "", ""
		}
		return h, "its holder"
	}
	routed := func(n string) bool { return cpv1.RoutedTo(pc.Labels, pc.Annotations, n) }
	if pc.Spec.SourcePodName != "" {
		po, ok, err := r.pods.GetStore().GetByKey(pc.Namespace + "/" + pc.Spec.SourcePodName)
		if err != nil || !ok || routed(po.(*corev1.Pod).Spec.NodeName) {
			return "", ""
		}
		return po.(*corev1.Pod).Spec.NodeName, "source pod " + pc.Spec.SourcePodName
	}
	pods, _ := r.pods.GetIndexer().ByIndex(byRestoreFrom, pc.Namespace+"/"+pc.Name)
	var node, pod string
	for _, o := range pods {
		p := o.(*corev1.Pod)
		if routed(p.Spec.NodeName) {
			return "", ""
		}
		if node == "" || p.Spec.NodeName < node {
			node, pod = p.Spec.NodeName, p.Name
		}
	}
	return node, "pod " + pod + " restores from it"
}

func (r *Router) enqueue(o any) {
	if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
		r.queue.Add(k)
	}
}

// podChanged queues the objects that name the pod, and the one it
// restores from.
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
	if k, err := restoreFromKey(p); err == nil && len(k) == 1 {
		if obj, ok, _ := r.objects.GetStore().GetByKey(k[0]); ok {
			r.enqueue(obj)
		}
	}
}

// restoreFromKey is the object key a pod's restore-from annotation would
// name: its namespace and the annotation's value (a directory name or an
// image reference names no object, and finds none).
// slimPod keeps of a pod only what routing reads, so that 15,000 pods cost
// the router a few MB: its restore-from annotation among its annotations,
// and only when it can name a PodCheckpoint (a DNS subdomain: a pod may
// write up to 256 KiB there).
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	slim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		ResourceVersion: p.ResourceVersion}, Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}}
	if v, ok := p.Annotations[podspec.RestoreFromKey]; ok && len(validation.IsDNS1123Subdomain(v)) == 0 {
		slim.Annotations = map[string]string{podspec.RestoreFromKey: v}
	}
	return slim, nil
}

func restoreFromKey(o any) ([]string, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	v := p.Annotations[podspec.RestoreFromKey]
	if v == "" || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Namespace + "/" + v}, nil
}

func sourcePodKey(o any) ([]string, error) {
	pc, ok := o.(*cpv1.PodCheckpoint)
	if !ok || pc.Spec.SourcePodName == "" {
		return nil, nil
	}
	return []string{pc.Namespace + "/" + pc.Spec.SourcePodName}, nil
}
