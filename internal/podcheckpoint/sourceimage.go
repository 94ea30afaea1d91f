package podcheckpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Status of an object with spec.sourceImage (docs/podcheckpoint.md). No node
// runs a source pod of it: the router routes it to the node of a pod that
// restores from it (internal/ckptrouter), and only that node may write it
// (the label is the ticket: deploy/admission). The routed node holds it once
// a pod restores from it there: Restores.Resolve tells the reconciler
// (SourceRestore, never waiting), which, once the object is routed to this
// node (the routed watch brings it; until then the request waits), checks
// the reference as the restore's pull would (this node's allow-list, the
// restoring pod's image pull secrets, then the node's; the index only, no
// blob) and then, in one optimistic status write, claims the object (status
// nodeName: the router no longer moves it) and records the outcome, the
// index's annotations and the restoring pod. There is no separate claim
// written before the check: a shim killed during a check leaves the object
// as it was (no status, or the holder's last outcome), never a claim that no
// outcome follows; two nodes checking a new object at once both ask the
// registry, and the write of one conflicts, reads the object held by the
// other, and is dropped (the router may also move an unheld object while a
// check runs: the write is then refused, and dropped). Later restores on the
// holding node check again: a new pod at most every sourceMinGap, the same
// pod after a failure at most every sourceRetry. Restores on other nodes
// write nothing (their pods' events tell how they went), so an object costs
// the registry one index request per restoring pod on one node.

// SourceChecker resolves a spec.sourceImage reference for a restoring pod
// (internal/ociartifact's RestorePuller).
type SourceChecker interface {
	CheckSource(ctx context.Context, ns, pod, uid, ref string) (ociartifact.SourceInfo, error)
}

// sourcePrefix marks the queue keys of source checks; a namespace (a DNS
// label) never begins with it.
const sourcePrefix = "@source/"

// Pacing of the checks of one object on its holding node.
var (
	sourceMinGap = 10 * time.Second
	sourceRetry  = 30 * time.Second
)

// maxSourceMessage bounds the Ready message of a failed check.
const maxSourceMessage = 1024

// sourceWaitMax is how long a request waits for its object to be routed
// to this node: the router routes it within seconds of the restoring pod's
// binding; one routed to another node (a pod of another node restores from
// it too) is that node's to check, and its request is dropped after this.
const sourceWaitMax = 10 * time.Minute

// sourceRequest is the newest restore that asked for an object.
type sourceRequest struct {
	pc       *cpv1.PodCheckpoint
	pod, uid string
	at       time.Time
}

// sourceState is the last check of an object on this node.
type sourceState struct {
	checking bool
	checked  time.Time
	podUID   string
	ok       bool
}

// SourceRestore records that pod ns/pod (UID uid) restores from pc, an
// object with spec.sourceImage, and queues a check of it unless another
// node holds it. It is called on the CRI path and never waits.
func (r *Reconciler) SourceRestore(pc *cpv1.PodCheckpoint, pod, uid string) {
	if h := pc.Status.NodeName; h != "" && h != r.cfg.Node || pc.Spec.SourceImage == "" {
		return
	}
	k := key(pc.Namespace, pc.Name)
	r.mu.Lock()
	for old, req := range r.srcReq {
		if r.now().Sub(req.at) > sourceWaitMax {
			delete(r.srcReq, old) // never routed here
		}
	}
	r.srcReq[k] = sourceRequest{pc: pc.DeepCopy(), pod: pod, uid: uid, at: r.now()}
	r.mu.Unlock()
	r.queue.Add(sourcePrefix + k)
}

// sourceRouted queues the check a restore asked for of the object k (an
// object with spec.sourceImage a watch brought: routed to this node now).
func (r *Reconciler) sourceRouted(k string) {
	r.mu.Lock()
	_, asked := r.srcReq[k]
	r.mu.Unlock()
	if asked {
		r.queue.Add(sourcePrefix + k)
	}
}

// reconcileSource checks the object k a restore asked for, when it is due.
func (r *Reconciler) reconcileSource(ctx context.Context, k string) error {
	r.mu.Lock()
	req, ok := r.srcReq[k]
	if !ok {
		r.mu.Unlock()
		return nil
	}
	pc := req.pc
	if cur := r.objects[k]; cur != nil && cur.UID == pc.UID {
		pc = cur.DeepCopy() // a watch's or our own write's copy is newer
	}
	if h := pc.Status.NodeName; h != "" && h != r.cfg.Node {
		delete(r.srcReq, k)
		r.mu.Unlock()
		return nil
	}
	if !cpv1.RoutedTo(pc.Labels, pc.Annotations, r.cfg.Node) {
		// Not routed here (yet): the routed watch brings the object when
		// the router routes it here, and reconcile queues this again.
		r.mu.Unlock()
		return nil
	}
	st := r.srcState[pc.UID]
	if st == nil {
		r.pruneSourceStates()
		st = &sourceState{}
		r.srcState[pc.UID] = st
	}
	if st.checking {
		r.mu.Unlock()
		return nil // queued again when the check ends
	}
	since := r.now().Sub(st.checked)
	if !st.checked.IsZero() && st.podUID == req.uid && (st.ok || since < sourceRetry) {
		// The kubelet's retries of one pod: recorded, or failed just now.
		delete(r.srcReq, k)
		r.mu.Unlock()
		return nil
	}
	if wait := sourceMinGap - since; !st.checked.IsZero() && wait > 0 {
		r.mu.Unlock()
		r.queue.AddAfter(sourcePrefix+k, wait)
		return nil
	}
	if !r.sourceSlots.take(pc.Namespace) {
		// Checks of other objects take the slots: the request waits.
		r.mu.Unlock()
		r.queue.AddAfter(sourcePrefix+k, slotWait)
		return nil
	}
	st.checking = true
	// The claim is the outcome's write (checkSource): nothing is written
	// before the registry answers, so no kill between the two can leave a
	// claim without an outcome.
	r.dropRequest(k, req)
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.sourceSlots.give(pc.Namespace)
		r.checkSource(ctx, pc, req, st)
	}()
	return nil
}

// dropRequest forgets the request of k if it is still req: one that came
// in meanwhile (another pod) waits for its own check. r.mu is held.
func (r *Reconciler) dropRequest(k string, req sourceRequest) {
	if cur, ok := r.srcReq[k]; ok && cur.uid == req.uid && cur.pod == req.pod {
		delete(r.srcReq, k)
	}
}

// checkSource asks the registry and writes the outcome with this node as the
// holder (the claim, when the object had none), retrying the write until the
// API server takes it or the object is gone or held elsewhere.
func (r *Reconciler) checkSource(ctx context.Context, pc *cpv1.PodCheckpoint, req sourceRequest, st *sourceState) {
	start := r.now()
	var info ociartifact.SourceInfo
	var err error
	if r.cfg.Sources == nil {
		// No registries configured: the allow-list's own refusal.
		_, _, err = ociartifact.ParseRestoreRef(pc.Spec.SourceImage, pc.Namespace, nil)
	} else {
		info, err = r.cfg.Sources.CheckSource(ctx, pc.Namespace, req.pod, req.uid, pc.Spec.SourceImage)
	}
	retry := r.retries()
	for ctx.Err() == nil {
		werr := r.sourceChecked(ctx, pc, req, info, err)
		if werr == nil {
			break
		}
		if errors.Is(werr, errHeldElsewhere) {
			// Another node checked it at the same time and wrote first.
			r.log.Info("podcheckpoint: another node holds the source image's object; its outcome stands", "object", key(pc.Namespace, pc.Name), "err", werr)
			break
		}
		if final(werr) {
			r.log.Warn("podcheckpoint: the source image's status not written", "object", key(pc.Namespace, pc.Name), "err", werr)
			break
		}
		r.log.Warn("podcheckpoint: writing the source image's status, retrying", "object", key(pc.Namespace, pc.Name), "err", werr)
		backoff.Sleep(ctx, retry.Step())
	}
	k := key(pc.Namespace, pc.Name)
	r.mu.Lock()
	st.checking, st.checked, st.podUID, st.ok = false, start, req.uid, err == nil
	_, more := r.srcReq[k]
	r.mu.Unlock()
	if more {
		r.queue.Add(sourcePrefix + k)
	}
}

// sourceChecked writes a check's outcome: Ready, status.sourceImage on
// success, and status.lastRestore either way.
func (r *Reconciler) sourceChecked(ctx context.Context, pc *cpv1.PodCheckpoint, req sourceRequest, info ociartifact.SourceInfo, cerr error) error {
	now := metav1.NewTime(r.now())
	reason, st := sourceReason(cerr), metav1.ConditionFalse
	var msg string
	if cerr == nil {
		st = metav1.ConditionTrue
		msg = fmt.Sprintf("%s is a checkpoint of pod %s/%s (containers %s); resolved for pod %s/%s on node %s",
			pc.Spec.SourceImage, info.PodNamespace, info.PodName, strings.Join(info.Containers, ", "), pc.Namespace, req.pod, r.cfg.Node)
	} else {
		msg = cerr.Error()
		if len(msg) > maxSourceMessage {
			// A registry's error body is in it; the condition's message
			// is at most 32 KiB, and a status is read often.
			msg = msg[:maxSourceMessage] + "..."
		}
	}
	err := r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
		s.NodeName = r.cfg.Node
		s.LastRestore = &cpv1.PodCheckpointRestoreStatus{PodName: req.pod, PodUID: types.UID(req.uid), NodeName: r.cfg.Node, Time: now}
		if cerr == nil {
			s.SourceImage = &cpv1.PodCheckpointSourceImageStatus{Digest: info.Digest, PodNamespace: info.PodNamespace,
				PodName: info.PodName, PodUID: types.UID(info.PodUID), Containers: info.Containers, ResolvedTime: now}
			if !info.CheckpointedAt.IsZero() {
				at := metav1.NewTime(info.CheckpointedAt)
				s.SourceImage.CheckpointedAt = &at
			}
		}
		setReady(s, st, reason, msg, pc.Generation, now.Time)
	})
	if err == nil && cerr != nil {
		r.ev.emit(objectRef(pc), corev1.EventTypeWarning, reason, msg)
	}
	return err
}

// final reports whether a status write's error will not go away by
// writing again: the object is gone, replaced or another node's, the API
// server refuses the write itself, or it was over maxStatusBytes (and a
// bounded failure was written instead).
func final(err error) bool {
	return errors.Is(err, errHeldElsewhere) || errors.Is(err, errReplaced) || errors.Is(err, errStatusTooLarge) ||
		apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsInvalid(err)
}

// sourceReason is the Ready reason of a check's outcome (CheckSource's
// errdefs classes).
func sourceReason(err error) string {
	switch {
	case err == nil:
		return cpv1.ReasonSourceImageResolved
	case errors.Is(err, layout.ErrForeignCheckpoint):
		return cpv1.ReasonNamespaceNotAllowed
	case errdefs.IsInvalidArgument(err):
		return cpv1.ReasonSourceImageInvalid
	case errdefs.IsPermissionDenied(err):
		return cpv1.ReasonRegistryNotAllowed
	case errdefs.IsNotFound(err), errdefs.IsUnauthorized(err):
		// One answer, so that an object cannot tell a digest missing
		// from credentials refused (ociartifact's notReadable).
		return cpv1.ReasonSourceImageNotFound
	case errdefs.IsFailedPrecondition(err):
		return cpv1.ReasonNotAPodCheckpoint
	default:
		return cpv1.ReasonSourceImageUnreachable
	}
}

// pruneSourceStates forgets checks older than an hour (objects no watch
// holds are never Forgotten). r.mu is held.
func (r *Reconciler) pruneSourceStates() {
	for uid, st := range r.srcState {
		if !st.checking && r.now().Sub(st.checked) > time.Hour {
			delete(r.srcState, uid)
		}
	}
}
