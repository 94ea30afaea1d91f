package podcheckpoint

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// fetchTTL is how long the answer of a background read of an object the
// watches do not hold is used before it is read again.
const fetchTTL = 10 * time.Second

// fetchTimeout bounds one background read of an object; a call waits for
// one at most this long ([checkpoint] object_wait's upper bound).
const fetchTimeout = 15 * time.Second

// deadlineMargin is how long before its own deadline a call stops waiting
// for a read: it must still answer, as a pull's wait leaves it too
// (internal/ociartifact's RestorePuller).
const deadlineMargin = 2 * time.Second

// Restores answers the restore-from names that name PodCheckpoints (the
// criu service's ResolveRestore) from memory: the reconciler's objects and
// the node's pod cache. An object the node does not watch (held by another
// node) is read in the background; the call waits for that read at most
// the configured wait (and never past its own deadline less a margin), so
// an API server that does not answer holds a RunPodSandbox only that long:
// the pod's RunPodSandbox then fails and the kubelet's retry finds the read
// done.
type Restores struct {
	node string
	wait time.Duration
	ev   EventSink
	view atomic.Pointer[restoreView]

	mu      sync.Mutex
	fetched map[string]fetchResult
	pending map[string]chan struct{} // reads running, closed when each ends
}

type restoreView struct {
	object func(ns, name string) *cpv1.PodCheckpoint
	pod    func(ns, name string) *corev1.Pod
	get    func(ctx context.Context, ns, name string) (*cpv1.PodCheckpoint, error)
	// template reads the template of an object whose data is on this node
	// (its data directory's TemplateFile).
	template func(pc *cpv1.PodCheckpoint) (*corev1.PodTemplateSpec, error)
	// source, if set, is told of each restore from an object with
	// spec.sourceImage (Reconciler.SourceRestore); it must not wait.
	source func(pc *cpv1.PodCheckpoint, pod, uid string)
}

type fetchResult struct {
	pc  *cpv1.PodCheckpoint // nil: no such object
	at  time.Time
	err error
}

// notYet is a refusal that only says the node's view is not in yet (the API
// connection, an object's read, the pod cache): of errdefs' Unavailable
// class, which the criu service keeps. The other refusals are about the
// checkpoint itself (FailedPrecondition there).
type notYet struct{ msg string }

func (e *notYet) Error() string { return e.msg }
func (e *notYet) Unwrap() error { return errdefs.ErrUnavailable }

func notYetf(format string, a ...any) error { return &notYet{msg: fmt.Sprintf(format, a...)} }

// NewRestores makes the resolver of node, whose calls wait at most wait
// (0: not at all) for the read of an object the node does not watch; it
// answers "not yet" until Run has connected.
func NewRestores(node string, wait time.Duration, ev EventSink) *Restores {
	return &Restores{node: node, wait: wait, ev: ev, fetched: map[string]fetchResult{}, pending: map[string]chan struct{}{}}
}

func (r *Restores) connect(v *restoreView) { r.view.Store(v) }

// Resolve returns the checkpoint directory (under the checkpoint root) of the
// PodCheckpoint name in namespace ns, or its spec.sourceImage, or, when
// another node holds it, the image reference its export pushed
// (status.export.image), for the pod ns/pod with UID uid, or why the pod
// cannot be restored from it yet, starting with KEP-5823's reason, which is
// also reported as a Warning event of the pod. A refusal that only says
// the answer is not in yet (the API connection, the object's read, the pod
// cache) is of errdefs' Unavailable class. ctx is the CRI call's: its
// deadline bounds the wait for an object's read.
func (r *Restores) Resolve(ctx context.Context, ns, pod, uid, name string) (string, error) {
	dir, err := r.resolve(ctx, ns, pod, uid, name)
	if err != nil {
		reason, note, _ := strings.Cut(err.Error(), ": ")
		r.ev.emit(kubeapi.PodObject(kubeapi.PodRef{Namespace: ns, Name: pod, UID: uid}), corev1.EventTypeWarning, reason, note)
	}
	return dir, err
}

func (r *Restores) resolve(ctx context.Context, ns, pod, uid, name string) (string, error) {
	v := r.view.Load()
	if v == nil {
		return "", notYetf("CheckpointNotReady: PodCheckpoint %q: the node's API connection is not up yet", name)
	}
	pc := v.object(ns, name)
	if pc == nil {
		var err error
		if pc, err = r.fetch(ctx, v, ns, name); err != nil {
			return "", err
		}
	}
	if pc.Spec.SourceImage != "" {
		// A checkpoint in a registry: the criu service pulls it under the
		// node's registry allow-list and the namespace binding; there is no
		// template to compare. The holding node's status records it.
		if v.source != nil {
			v.source(pc, pod, uid)
		}
		return pc.Spec.SourceImage, nil
	}
	elsewhere := pc.Status.NodeName != r.node && pc.Status.NodeName != ""
	if elsewhere && pc.Spec.Export == nil {
		return "", fmt.Errorf("CheckpointWrongNode: PodCheckpoint %q is on node %q, this is node %q, and has no spec.export", name, pc.Status.NodeName, r.node)
	}
	c := ready(pc)
	if c == nil || c.Status != metav1.ConditionTrue || pc.Status.NodeName == "" {
		why := "no Ready condition"
		if c != nil {
			why = c.Reason
		}
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q is not Ready (%s)", name, why)
	}
	if !validDigest(pc.Status.PodSpecDigest) {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q has no podSpecDigest", name)
	}
	if err := r.matchesTemplate(v, ns, pod, uid, name, pc, elsewhere); err != nil {
		return "", err
	}
	if elsewhere {
		// Another node holds the data: restore the copy that node pushed.
		return exportedRef(pc, name)
	}
	loc := pc.Status.CheckpointLocation
	if loc == nil || loc.Type != cpv1.CheckpointSourceTypeNodeLocal || loc.NodeLocal == nil {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q has no node-local location", name)
	}
	// The data directory follows from the object's UID; a status naming
	// another (any status writer can set it) would restore other data than
	// the template just compared.
	if loc.NodeLocal.Path != DataDir(pc) {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q names location %q, not its own data directory", name, loc.NodeLocal.Path)
	}
	return DataDir(pc), nil
}

// matchesTemplate checks the restoring pod ns/pod (UID uid, from the node's
// pod cache) against pc's template. On the node holding the checkpoint
// (elsewhere false) that is the template in its data directory, which must
// still have the status's digest (a status naming another spec is refused),
// and a mismatch names the first differing field. Another node has only
// status.podSpecDigest to compare the pod's digest with.
func (r *Restores) matchesTemplate(v *restoreView, ns, pod, uid, name string, pc *cpv1.PodCheckpoint, elsewhere bool) error {
	p := v.pod(ns, pod)
	if p == nil || string(p.UID) != uid {
		return notYetf("CheckpointNotReady: pod %s/%s (UID %s) is not in the node's pod cache yet", ns, pod, uid)
	}
	want := pc.Status.PodSpecDigest
	if elsewhere {
		got, err := SpecDigest(Template(p))
		if err != nil {
			return fmt.Errorf("PodSpecMismatch: comparing with PodCheckpoint %q: %v", name, err)
		}
		if got != want {
			return fmt.Errorf("PodSpecMismatch: the pod's spec differs from the template PodCheckpoint %q was taken of (status.podSpecDigest %s, the pod's %s; node %q holds the template)", name, want, got, pc.Status.NodeName)
		}
		return nil
	}
	if v.template == nil {
		return fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: this node reads no checkpoint templates", name)
	}
	t, err := v.template(pc)
	if err != nil {
		return fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: its template: %v", name, err)
	}
	if d, err := SpecDigest(t); err != nil || d != want {
		return fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: status.podSpecDigest %s is not the digest of the template this node recorded (%s, %v)", name, want, d, err)
	}
	field, err := SpecMismatch(p, t)
	if err != nil {
		return fmt.Errorf("PodSpecMismatch: comparing with PodCheckpoint %q: %v", name, err)
	}
	if field != "" {
		return fmt.Errorf("PodSpecMismatch: %s differs from the template PodCheckpoint %q was taken of", field, name)
	}
	return nil
}

// validDigest reports whether d is "sha256:" and 64 lower-case hex digits
// (the CRD's pattern; a status from before the field, or a hand-written
// one, may have none).
func validDigest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// exportedRef is the reference by digest that pc's holder pushed for
// spec.export, once Exported is True and the record holds (exportRecord:
// the holder is the node pc is routed to, the reference spec.export.image's
// repository at status.export.digest); the node's registry allow-list, its
// pull checks and the namespace binding judge it again when it is pulled.
func exportedRef(pc *cpv1.PodCheckpoint, name string) (string, error) {
	c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported)
	if c == nil || c.Status != metav1.ConditionTrue || pc.Status.Export == nil {
		why := "not pushed yet"
		if c != nil {
			why = c.Reason
		}
		return "", fmt.Errorf("CheckpointWrongNode: PodCheckpoint %q is on node %q and not exported (%s)", name, pc.Status.NodeName, why)
	}
	if _, err := exportRecord(pc); err != nil {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: %v", name, err)
	}
	return pc.Status.Export.Image, nil
}

// fetch returns the read of ns/name from the API server, which runs in
// the background. An answer at most fetchTTL old is used at once;
// otherwise a read is started (or the running one joined) and waited for
// (await). A read still running then goes on, for the kubelet's retry, and
// the call gets the previous answer if there is one, else "being looked up".
func (r *Restores) fetch(ctx context.Context, v *restoreView, ns, name string) (*cpv1.PodCheckpoint, error) {
	k := key(ns, name)
	r.mu.Lock()
	res, ok := r.fetched[k]
	var done chan struct{}
	if !ok || time.Since(res.at) > fetchTTL {
		done = r.read(v, k, ns, name)
	}
	r.mu.Unlock()
	if done != nil && r.await(ctx, done) {
		r.mu.Lock()
		res, ok = r.fetched[k]
		r.mu.Unlock()
	}
	switch {
	case !ok:
		return nil, notYetf("CheckpointNotReady: PodCheckpoint %q of namespace %q is being looked up", name, ns)
	case res.err != nil:
		return nil, notYetf("CheckpointNotReady: PodCheckpoint %q: %v", name, res.err)
	case res.pc == nil:
		return nil, fmt.Errorf("CheckpointNotReady: no PodCheckpoint %q in namespace %q", name, ns)
	}
	return res.pc, nil
}

// read starts the background read of ns/name (key k) unless one is
// running, and returns the channel closed when it has ended and its answer
// is in fetched. r.mu is held.
func (r *Restores) read(v *restoreView, k, ns, name string) chan struct{} {
	if done := r.pending[k]; done != nil {
		return done
	}
	done := make(chan struct{})
	r.pending[k] = done
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
		defer cancel()
		pc, err := v.get(ctx, ns, name)
		if apierrors.IsNotFound(err) {
			pc, err = nil, nil
		}
		r.mu.Lock()
		// Names come from pods' annotations: answers past their use
		// are dropped, so the map holds what was asked within fetchTTL.
		for old, res := range r.fetched {
			if time.Since(res.at) > fetchTTL {
				delete(r.fetched, old)
			}
		}
		r.fetched[k] = fetchResult{pc: pc, at: time.Now(), err: err}
		delete(r.pending, k)
		r.mu.Unlock()
		close(done)
	}()
	return done
}

// await waits for done at most r.wait, and never later than deadlineMargin
// before ctx's deadline (the call must still answer in time, and a pull may
// follow), and reports whether done is closed. The kubelet gives
// RunPodSandbox 4 minutes; an API server that does not answer holds it only
// this long.
func (r *Restores) await(ctx context.Context, done <-chan struct{}) bool {
	wait := r.wait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-deadlineMargin)
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}
