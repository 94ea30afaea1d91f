package podcheckpoint

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gcrname "github.com/google/go-containerregistry/pkg/name"
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

// Restores answers the restore-from names that name PodCheckpoints (the
// criu service's ResolveRestore) from memory: the reconciler's objects and
// the node's pod cache. An object the node does not watch (held by another
// node) is read in the background; until that answer is in, the pod's
// RunPodSandbox fails and the kubelet retries. Nothing here waits on the
// API server.
type Restores struct {
	node string
	ev   EventSink
	view atomic.Pointer[restoreView]

	mu      sync.Mutex
	fetched map[string]fetchResult
	pending map[string]bool
}

type restoreView struct {
	object func(ns, name string) *cpv1.PodCheckpoint
	pod    func(ns, name string) *corev1.Pod
	get    func(ctx context.Context, ns, name string) (*cpv1.PodCheckpoint, error)
	// source, if set, is told of each restore from an object with
	// spec.sourceImage (Reconciler.SourceRestore); it must not wait.
	source func(pc *cpv1.PodCheckpoint, pod, uid string)
}

type fetchResult struct {
	pc  *cpv1.PodCheckpoint // nil: no such object
	at  time.Time
	err error
}

// NewRestores makes the resolver of node; it answers "not yet" until Run
// has connected.
func NewRestores(node string, ev EventSink) *Restores {
	return &Restores{node: node, ev: ev, fetched: map[string]fetchResult{}, pending: map[string]bool{}}
}

func (r *Restores) connect(v *restoreView) { r.view.Store(v) }

// Resolve returns the checkpoint directory (under the checkpoint root) of the
// PodCheckpoint name in namespace ns, or its spec.sourceImage, or, when
// another node holds it, the image reference its export pushed
// (status.export.image), for the pod ns/pod with UID uid, or why the pod
// cannot be restored from it yet, starting with KEP-5823's reason, which is
// also reported as a Warning event of the pod.
func (r *Restores) Resolve(ns, pod, uid, name string) (string, error) {
	dir, err := r.resolve(ns, pod, uid, name)
	if err != nil {
		reason, note, _ := strings.Cut(err.Error(), ": ")
		r.ev.emit(kubeapi.PodObject(kubeapi.PodRef{Namespace: ns, Name: pod, UID: uid}), corev1.EventTypeWarning, reason, note)
	}
	return dir, err
}

func (r *Restores) resolve(ns, pod, uid, name string) (string, error) {
	v := r.view.Load()
	if v == nil {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: the node's API connection is not up yet", name)
	}
	pc := v.object(ns, name)
	if pc == nil {
		var err error
		if pc, err = r.fetch(v, ns, name); err != nil {
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
	if pc.Status.CheckpointedPodTemplate == nil {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q has no checkpointedPodTemplate", name)
	}
	if err := r.matchesTemplate(v, ns, pod, uid, name, pc); err != nil {
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
// pod cache) against pc's checkpointedPodTemplate.
func (r *Restores) matchesTemplate(v *restoreView, ns, pod, uid, name string, pc *cpv1.PodCheckpoint) error {
	p := v.pod(ns, pod)
	if p == nil || string(p.UID) != uid {
		return fmt.Errorf("CheckpointNotReady: pod %s/%s (UID %s) is not in the node's pod cache yet", ns, pod, uid)
	}
	field, err := SpecMismatch(p, pc.Status.CheckpointedPodTemplate)
	if err != nil {
		return fmt.Errorf("PodSpecMismatch: comparing with PodCheckpoint %q: %v", name, err)
	}
	if field != "" {
		return fmt.Errorf("PodSpecMismatch: %s differs from PodCheckpoint %q's checkpointedPodTemplate", field, name)
	}
	return nil
}

// exportedRef is the reference by digest that pc's holder pushed for
// spec.export, once Exported is True. It must be spec.export.image's
// repository at status.export.digest: the namespace chose that destination
// (status is the holding node's word, the repository is the namespace's),
// and the node's registry allow-list, its pull checks and the namespace
// binding judge it again when it is pulled.
func exportedRef(pc *cpv1.PodCheckpoint, name string) (string, error) {
	s := pc.Status.Export
	c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported)
	if c == nil || c.Status != metav1.ConditionTrue || s == nil {
		why := "not pushed yet"
		if c != nil {
			why = c.Reason
		}
		return "", fmt.Errorf("CheckpointWrongNode: PodCheckpoint %q is on node %q and not exported (%s)", name, pc.Status.NodeName, why)
	}
	// Parsed as the push names it: no tag is ":latest"; the registry is
	// spelt out (the schema's pattern, and the push refuses it otherwise).
	tag, err := gcrname.NewTag(pc.Spec.Export.Image)
	if err != nil {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: spec.export.image: %v", name, err)
	}
	if want := tag.Context().Digest(s.Digest).String(); s.Image != want {
		return "", fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: status.export.image %q is not spec.export.image's repository at status.export.digest (%s)", name, s.Image, want)
	}
	return s.Image, nil
}

// fetch returns the last background read of ns/name, starting one when
// there is none or it is old.
func (r *Restores) fetch(v *restoreView, ns, name string) (*cpv1.PodCheckpoint, error) {
	k := key(ns, name)
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.fetched[k]
	if (!ok || time.Since(res.at) > fetchTTL) && !r.pending[k] {
		r.pending[k] = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
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
		}()
	}
	switch {
	case !ok:
		return nil, fmt.Errorf("CheckpointNotReady: PodCheckpoint %q of namespace %q is being looked up", name, ns)
	case res.err != nil:
		return nil, fmt.Errorf("CheckpointNotReady: PodCheckpoint %q: %v", name, res.err)
	case res.pc == nil:
		return nil, fmt.Errorf("CheckpointNotReady: no PodCheckpoint %q in namespace %q", name, ns)
	}
	return res.pc, nil
}
