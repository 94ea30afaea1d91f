package podcheckpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podtable"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Checkpointer takes a pod checkpoint: internal/capture's Service.
type Checkpointer interface {
	CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error)
}

// Runtime is the node's sandboxes (the pod table's List) and the runtime's
// containers (its CRI client's ListContainers).
type Runtime interface {
	List(keep func(*podtable.Sandbox) bool) []podtable.Sandbox
	ListContainers(ctx context.Context, in *runtimeapi.ListContainersRequest, opts ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error)
}

// Objects writes PodCheckpoints (Client).
type Objects interface {
	Get(ctx context.Context, ns, name string) (*cpv1.PodCheckpoint, error)
	Update(ctx context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error)
	UpdateStatus(ctx context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error)
}

// Pods reads a live Pod object. The pod returned may be an informer's
// cached copy (informerPods), shared with the cache: callers never change it
// (Template and SpecMismatch copy what they keep).
type Pods interface {
	GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error)
}

// Config is what the reconciler needs to know of the node.
type Config struct {
	// Node is this node's name (status.nodeName of the objects it holds).
	Node string
	// Root is the checkpoint root; an object's data is Root/DataDir(object).
	Root string
	// DefaultTimeout bounds a checkpoint whose spec has no timeoutSeconds.
	DefaultTimeout time.Duration
	// Exporter pushes objects with spec.export (export.go); nil fails them.
	Exporter Exporter
	// Sources checks the references of objects with spec.sourceImage that
	// pods of this node restore from (sourceimage.go); nil: this node has
	// no registries, and such objects are RegistryNotAllowed.
	Sources SourceChecker
}

// Reconciler checkpoints the pods of this node that PodCheckpoints name and
// writes the outcome into their status. It is level-triggered: Observe and
// Forget feed it the objects the watches see; a queue of keys serializes the
// work per object, and a per-pod guard keeps one checkpoint per pod in flight.
type Reconciler struct {
	cfg  Config
	ckpt Checkpointer
	rt   Runtime
	objs Objects
	pods Pods
	log  *slog.Logger
	ev   EventSink
	now  func() time.Time
	// retryEvery is the first wait before a status write the API server
	// refused or did not answer is tried again (backoff.Retry from there,
	// up to retryMax).
	retryEvery time.Duration

	queue workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	objects map[string]*cpv1.PodCheckpoint // ns/name -> newest seen
	// started holds the objects this process checkpointed: a copy of one
	// that a watch delivers late (still InProgress or Pending) is not
	// started again. claimed holds those it wrote InProgress for, or tried
	// to: a write that failed may have been applied with its answer lost,
	// so an InProgress copy of one is not an earlier shim's leftover, and
	// its checkpoint is started once the write succeeds.
	started map[types.UID]bool
	claimed map[types.UID]bool
	byPod   map[string]types.UID // ns/pod -> object checkpointing it
	// exporting holds the objects being pushed (export.go), exportFailed
	// when the last push of an object failed.
	exporting    map[types.UID]bool
	exportFailed map[types.UID]exportFailure
	exporter     Exporter
	// srcReq holds the restores that asked for objects with
	// spec.sourceImage, srcState their last checks (sourceimage.go).
	srcReq   map[string]sourceRequest
	srcState map[types.UID]*sourceState
	// exportSlots and sourceSlots bound the pushes and the source checks
	// running at once (slots.go).
	exportSlots, sourceSlots *slots
	wg                       sync.WaitGroup
}

// NewReconciler builds a reconciler; Run starts it.
func NewReconciler(cfg Config, ckpt Checkpointer, rt Runtime, objs Objects, pods Pods, ev EventSink, log *slog.Logger) *Reconciler {
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 10 * time.Minute
	}
	return &Reconciler{
		cfg: cfg, ckpt: ckpt, rt: rt, objs: objs, pods: pods, ev: ev, log: log, now: time.Now,
		retryEvery: time.Second,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "podcheckpoint"}),
		objects: make(map[string]*cpv1.PodCheckpoint),
		started: make(map[types.UID]bool),
		claimed: make(map[types.UID]bool),
		byPod:   make(map[string]types.UID),

		exporting:    make(map[types.UID]bool),
		exportFailed: make(map[types.UID]exportFailure),
		exporter:     cfg.Exporter,
		srcReq:       make(map[string]sourceRequest),
		srcState:     make(map[types.UID]*sourceState),
		exportSlots:  newSlots(maxExports, maxNSExports),
		sourceSlots:  newSlots(maxSourceChecks, maxNSSourceChecks),
	}
}

// DataDir is an object's directory under the checkpoint root: named by the
// object's UID, so a restarted shim finds the partial data of an object it
// was checkpointing.
func DataDir(pc *cpv1.PodCheckpoint) string { return layout.ObjectDirPrefix + string(pc.UID) }

func key(ns, name string) string { return ns + "/" + name }

// dataDirs are the data directories of the objects the reconciler knows.
func (r *Reconciler) dataDirs() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]bool, len(r.objects))
	for _, pc := range r.objects {
		out[DataDir(pc)] = true
	}
	return out
}

// Observe records an object a watch saw and queues it.
func (r *Reconciler) Observe(pc *cpv1.PodCheckpoint) {
	k := key(pc.Namespace, pc.Name)
	r.mu.Lock()
	if old := r.objects[k]; old == nil || old.UID != pc.UID || newer(pc, old) {
		r.objects[k] = pc
	}
	r.mu.Unlock()
	r.queue.Add(k)
}

// newer reports whether a is a later version of the same object than b.
// Two watches and the reconciler's own writes feed Observe, each in order
// but not with each other: a copy one watch delivers late must not replace
// the newer one a write returned, or the next write is a Conflict and a
// GET. Resource versions are etcd revisions, compared as numbers as
// client-go's MutationCache does (tools/cache/mutation_cache.go, through
// apiserver's APIObjectVersioner); one that is not a number is taken as
// newer when it differs.
func newer(a, b *cpv1.PodCheckpoint) bool {
	av, aerr := strconv.ParseUint(a.ResourceVersion, 10, 64)
	bv, berr := strconv.ParseUint(b.ResourceVersion, 10, 64)
	if aerr != nil || berr != nil {
		return a.ResourceVersion != b.ResourceVersion
	}
	return av > bv
}

// Forget drops an object a watch saw deleted (or no longer selects).
func (r *Reconciler) Forget(ns, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.objects[key(ns, name)]; cur != nil {
		r.drop(cur)
	}
}

// forgetUID forgets pc's object if the copy held is of pc's UID.
func (r *Reconciler) forgetUID(pc *cpv1.PodCheckpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.objects[key(pc.Namespace, pc.Name)]; cur != nil && cur.UID == pc.UID {
		r.drop(cur)
	}
}

// drop forgets pc and what this process recorded of its checkpoint, so a
// node that checkpoints on a schedule does not keep a record of every
// object it ever made. r.mu held.
func (r *Reconciler) drop(pc *cpv1.PodCheckpoint) {
	delete(r.objects, key(pc.Namespace, pc.Name))
	delete(r.started, pc.UID)
	delete(r.claimed, pc.UID)
}

// Lookup returns the newest copy seen of an object, nil if none: the
// restore path's view, never a call to the API server.
func (r *Reconciler) Lookup(ns, name string) *cpv1.PodCheckpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pc := r.objects[key(ns, name)]; pc != nil {
		return pc.DeepCopy()
	}
	return nil
}

// errNotYet is an object whose pod is not ready for its checkpoint yet:
// looked at again with the queue's backoff (500 ms doubling to 30 s), from
// the pod informer and the runtime, never the API server.
var errNotYet = errors.New("not yet")

// Run works the queue until ctx ends, then waits for checkpoints in flight.
func (r *Reconciler) Run(ctx context.Context) {
	go func() { <-ctx.Done(); r.queue.ShutDown() }()
	for {
		k, quit := r.queue.Get()
		if quit {
			break
		}
		if err := r.reconcile(ctx, k); err != nil {
			if !errors.Is(err, errNotYet) {
				r.log.Warn("podcheckpoint: reconcile", "object", k, "err", err)
			}
			r.queue.AddRateLimited(k)
		} else {
			r.queue.Forget(k)
		}
		r.queue.Done(k)
	}
	r.wg.Wait()
}

func (r *Reconciler) get(k string) *cpv1.PodCheckpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pc := r.objects[k]; pc != nil {
		return pc.DeepCopy()
	}
	return nil
}

// ready is the object's Ready condition, nil before any.
func ready(pc *cpv1.PodCheckpoint) *metav1.Condition {
	return meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionReady)
}

// terminal: Ready True, or False with a reason nothing follows.
func terminal(pc *cpv1.PodCheckpoint) bool {
	c := ready(pc)
	return c != nil && (c.Status == metav1.ConditionTrue || c.Reason == cpv1.ReasonFailed || c.Reason == cpv1.ReasonSourcePodReplaced)
}

func (r *Reconciler) reconcile(ctx context.Context, k string) error {
	if src, ok := strings.CutPrefix(k, sourcePrefix); ok {
		return r.reconcileSource(ctx, src)
	}
	pc := r.get(k)
	if pc == nil {
		return nil
	}
	// The object's requests, and those of the checkpoint or push it starts,
	// take their namespace's turns in the node's token bucket.
	ctx = kubeapi.ForNamespace(ctx, pc.Namespace)
	if pc.Spec.SourceImage != "" {
		r.sourceRouted(k)
		return nil
	}
	if h := pc.Status.NodeName; h != "" && h != r.cfg.Node || pc.Spec.SourcePodName == "" {
		return nil // another node's, or a registry's (spec.sourceImage: sourceimage.go)
	}
	r.mu.Lock()
	// The pod's checkpoint in flight is this object's (spec is immutable).
	busy, ours, claimed := r.byPod[key(pc.Namespace, pc.Spec.SourcePodName)] == pc.UID, r.started[pc.UID], r.claimed[pc.UID]
	r.mu.Unlock()
	if pc.DeletionTimestamp != nil {
		if busy {
			return nil // requeued when the checkpoint ends
		}
		return r.finalize(ctx, pc)
	}
	if ok, wait := r.needsExport(pc); ok && !busy {
		return r.startExport(ctx, pc)
	} else if wait > 0 {
		r.queue.AddAfter(k, wait)
	}
	if terminal(pc) || busy || ours {
		return nil
	}
	if c := ready(pc); pc.Status.NodeName == r.cfg.Node && c != nil && c.Reason == cpv1.ReasonInProgress && !claimed {
		// This node was checkpointing it and no checkpoint runs: an earlier
		// shim died mid-checkpoint (KEP-5823: not resumable; finalise as failed).
		r.removeData(pc)
		return r.fail(ctx, pc, "the node's cri-shim restarted during the checkpoint; partial data removed")
	}
	sb := r.sandbox(pc.Namespace, pc.Spec.SourcePodName)
	if sb == nil {
		if pc.Status.NodeName == r.cfg.Node {
			return r.fail(ctx, pc, "pod "+pc.Spec.SourcePodName+" no longer runs on node "+r.cfg.Node)
		}
		if r.boundHere(ctx, pc) {
			// The router routes an object once its pod is bound, before
			// the pod's sandbox is ready: looked at again with backoff.
			return fmt.Errorf("%w: pod %s has no ready sandbox on this node yet", errNotYet, pc.Spec.SourcePodName)
		}
		return nil // not a pod of this node
	}
	uid := types.UID(sb.Metadata.GetUid())
	if want := pc.Spec.SourcePodUID; want != nil && *want != uid {
		return r.replaced(ctx, pc, uid, fmt.Sprintf("spec.sourcePodUID is %s, the live pod %s has UID %s", *want, pc.Spec.SourcePodName, uid))
	}
	if pinned := pc.Status.SourcePodUID; pinned != nil && *pinned != uid {
		return r.replaced(ctx, pc, uid, fmt.Sprintf("the pod %s was %s when this node took the object, it is now %s", pc.Spec.SourcePodName, *pinned, uid))
	}
	if pc.Status.NodeName == "" {
		// Hold it: from now on no other node may write it (deploy/admission).
		return r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
			s.NodeName = r.cfg.Node
			s.SourcePodUID = &uid
			setReady(s, metav1.ConditionFalse, cpv1.ReasonPending, "pod "+pc.Spec.SourcePodName+" runs on node "+r.cfg.Node, pc.Generation, r.now())
		})
	}
	if !slices.Contains(pc.Finalizers, cpv1.NodeDataFinalizer) {
		pc.Finalizers = append(pc.Finalizers, cpv1.NodeDataFinalizer)
		out, err := r.objs.Update(ctx, pc)
		if err != nil {
			return err
		}
		r.Observe(out)
		return nil
	}
	return r.start(ctx, pc, sb)
}

// boundHere says whether no node holds pc yet and its source pod is bound
// to this node, or the node's pod informer cannot tell yet (not listed).
func (r *Reconciler) boundHere(ctx context.Context, pc *cpv1.PodCheckpoint) bool {
	if pc.Status.NodeName != "" {
		return false
	}
	pod, err := r.pods.GetPod(ctx, pc.Namespace, pc.Spec.SourcePodName)
	if err != nil {
		return !apierrors.IsNotFound(err)
	}
	return pod.Spec.NodeName == r.cfg.Node && pod.DeletionTimestamp == nil
}

// start runs the checkpoint in the background once the pod is ready for one.
func (r *Reconciler) start(ctx context.Context, pc *cpv1.PodCheckpoint, sb *podtable.Sandbox) error {
	pod, err := r.pods.GetPod(ctx, pc.Namespace, pc.Spec.SourcePodName)
	if err != nil {
		return fmt.Errorf("reading pod %s/%s: %w", pc.Namespace, pc.Spec.SourcePodName, err)
	}
	if pod.UID != types.UID(sb.Metadata.GetUid()) {
		return fmt.Errorf("pod %s/%s: API has UID %s, the node's sandbox %s", pod.Namespace, pod.Name, pod.UID, sb.Metadata.GetUid())
	}
	ids, missing, err := r.runningContainers(ctx, sb.ID, pod)
	if err != nil {
		return err
	}
	if missing != "" {
		// KEP-5823: every regular container and sidecar running first.
		return fmt.Errorf("%w: container %s of pod %s is not running", errNotYet, missing, pc.Spec.SourcePodName)
	}
	podKey := key(pc.Namespace, pc.Spec.SourcePodName)
	r.mu.Lock()
	if other, ok := r.byPod[podKey]; ok && other != pc.UID {
		r.mu.Unlock()
		return fmt.Errorf("%w: another checkpoint of pod %s is in progress", errNotYet, pc.Spec.SourcePodName)
	}
	r.claimed[pc.UID] = true
	r.byPod[podKey] = pc.UID
	r.mu.Unlock()
	msg := fmt.Sprintf("checkpointing %d containers of pod %s", len(ids), pc.Spec.SourcePodName)
	err = r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
		setReady(s, metav1.ConditionFalse, cpv1.ReasonInProgress, msg, pc.Generation, r.now())
	})
	if err != nil {
		// Not started: the queue's backoff takes the object up again. Had
		// it counted as started, it would stay Pending (or InProgress) for
		// good after one refused write.
		r.mu.Lock()
		delete(r.byPod, podKey)
		r.mu.Unlock()
		return err
	}
	r.mu.Lock()
	r.started[pc.UID] = true
	r.mu.Unlock()
	r.ev.emit(objectRef(pc), corev1.EventTypeNormal, EventCheckpointStarted, msg)
	timeout := r.cfg.DefaultTimeout
	if t := pc.Spec.TimeoutSeconds; t != nil && *t > 0 {
		timeout = time.Duration(*t) * time.Second
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.done(pc, podKey)
		r.checkpoint(ctx, pc, pod, sb.ID, ids, timeout)
	}()
	return nil
}

func (r *Reconciler) done(pc *cpv1.PodCheckpoint, podKey string) {
	r.mu.Lock()
	if r.byPod[podKey] == pc.UID {
		delete(r.byPod, podKey)
	}
	r.mu.Unlock()
	r.queue.Add(key(pc.Namespace, pc.Name))
}

func (r *Reconciler) replaced(ctx context.Context, pc *cpv1.PodCheckpoint, uid types.UID, msg string) error {
	err := r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
		s.NodeName = r.cfg.Node
		s.SourcePodUID = &uid
		setReady(s, metav1.ConditionFalse, cpv1.ReasonSourcePodReplaced, msg, pc.Generation, r.now())
	})
	if err == nil {
		r.ev.emit(objectRef(pc), corev1.EventTypeWarning, cpv1.ReasonSourcePodReplaced, msg)
	}
	return err
}

// fail ends an object this node holds with CheckpointFailed.
func (r *Reconciler) fail(ctx context.Context, pc *cpv1.PodCheckpoint, msg string) error {
	err := r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
		setReady(s, metav1.ConditionFalse, cpv1.ReasonFailed, msg, pc.Generation, r.now())
	})
	if err == nil {
		r.ev.emit(objectRef(pc), corev1.EventTypeWarning, EventCheckpointFailed, msg)
	}
	return err
}

// retryMax bounds the wait between two tries of a status write.
const retryMax = time.Minute

// retries is the backoff of one retried status write.
func (r *Reconciler) retries() *wait.Backoff { return backoff.Retry(r.retryEvery, retryMax) }
