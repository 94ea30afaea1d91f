// Package podstatus tells the API server what the shim does to a pod, so
// that kubectl shows the truth: the AllContainersRestarting condition during
// an in-place restart, the pod not Ready while a container is held by the
// backoff or restarted (the readiness gate ReadyCondition), and events for
// restarts, holds and refused annotations. It hears of restarts from
// the restart engine (restartapi.Observer) and of new pods through the pod table's
// admission (Admit, registered last); everything it writes is queued (internal/kubeapi), so
// no CRI call waits for the API. docs/kubernetes-api.md.
package podstatus

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// ReadyCondition is the readiness gate the shim owns: False from the
// moment a restart rule matches (through the backoff hold and the restart)
// until the restarted containers run, True otherwise. The admission policy
// deploy/admission/restart-readiness.yaml adds it to the readinessGates of
// pods that carry cri-shim restart annotations, in namespaces that opt in;
// the kubelet counts it into the pod's Ready condition and never writes it
// itself.
const ReadyCondition corev1.PodConditionType = "restart.cri-shim.io/ready"

// ReasonAllContainersRestarting is the kubelet's own reason for a True
// AllContainersRestarting (pkg/kubelet/status/generate.go,
// RestartAllContainersStarted).
const ReasonAllContainersRestarting = "RestartAllContainersStarted"

// writer is what podstatus needs of kubeapi.Writer.
type writer interface {
	SetPodCondition(pod kubeapi.PodRef, c kubeapi.Condition)
	Event(e kubeapi.Event)
}

// Reporter turns the shim's restarts into pod conditions and events.
type Reporter struct {
	w     writer
	owner *ownerCheck
	log   *slog.Logger
	now   func() time.Time

	// mu guards waiting: the newest AllContainersRestarting of each pod
	// while it is not yet known whether the kubelet owns the condition
	// (the API server was not reachable since the shim started). They are
	// written once it is known that the kubelet does not.
	mu      sync.Mutex
	waiting map[string]restartingCond

	snapshot func() []restartapi.PodState
}

type restartingCond struct {
	pod kubeapi.PodRef
	c   kubeapi.Condition
}

// maxWaiting bounds the conditions kept while ownership is unknown.
const maxWaiting = 1024

// New reports through api's writer; it asks api's client whether the
// kubelet owns AllContainersRestarting (Run), and catches up from snapshot,
// the restart state of the node's pods (the restart engine's Snapshot; nil:
// none).
func New(api *kubeapi.API, snapshot func() []restartapi.PodState, log *slog.Logger) *Reporter {
	r := &Reporter{w: api.Writer, owner: newOwnerCheck(api.Client, log), log: log, now: time.Now, snapshot: snapshot}
	r.owner.known = r.ownerKnown
	return r
}

// setRestarting writes AllContainersRestarting unless the kubelet owns it;
// while that is unknown, the newest value per pod waits.
func (r *Reporter) setRestarting(pod kubeapi.PodRef, c kubeapi.Condition) {
	c.Type = corev1.AllContainersRestarting
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.owner.state.Load() {
	case ownerShim:
		r.w.SetPodCondition(pod, c)
	case ownerUnknown:
		if r.waiting == nil {
			r.waiting = map[string]restartingCond{}
		}
		if _, ok := r.waiting[pod.UID]; ok || len(r.waiting) < maxWaiting {
			r.waiting[pod.UID] = restartingCond{pod, c}
		}
	}
}

// ownerKnown writes the waiting conditions if the shim may, else drops them.
func (r *Reporter) ownerKnown(owner int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if owner == ownerShim {
		for _, w := range r.waiting {
			r.w.SetPodCondition(w.pod, w.c)
		}
	}
	r.waiting = nil
}

// Run writes the conditions of every pod podstate tracks once the client is
// ready (writes queued by an earlier shim process are lost with it), then
// keeps the answer to "does the kubelet own AllContainersRestarting"
// current until ctx is done.
func (r *Reporter) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-r.owner.c.Ready():
	}
	if r.snapshot != nil {
		r.catchUp(r.snapshot())
	}
	r.owner.run(ctx)
}

// catchUp writes each pod's conditions as they are now, with the time its
// restart state last changed (so a condition already written keeps its
// lastTransitionTime). No events: they were told when it happened.
func (r *Reporter) catchUp(pods []restartapi.PodState) {
	for _, s := range pods {
		pod := ref(s.Pod)
		if s.Restarting {
			t := s.Trigger
			r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionFalse, Reason: "RestartInProgress",
				Message: fmt.Sprintf("container %s exited with code %d; restarting in place", t.Container, t.ExitCode), At: s.Since})
			if t.Action == string(podspec.ActionRestartAllContainers) {
				r.setRestarting(pod, kubeapi.Condition{Status: corev1.ConditionTrue, Reason: ReasonAllContainersRestarting,
					Message: fmt.Sprintf("container %s exited with code %d; restarting all containers in place", t.Container, t.ExitCode), At: s.Since})
			}
			continue
		}
		r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionTrue, At: s.Since})
		if s.RestartedAll {
			r.setRestarting(pod, kubeapi.Condition{Status: corev1.ConditionFalse, At: s.Since})
		}
	}
}

var _ restartapi.Observer = (*Reporter)(nil)

func ref(p restartapi.PodRef) kubeapi.PodRef {
	return kubeapi.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// Events of one kind for one pod are aggregated by client-go's events
// recorder into a series by type, reason and action: the note of a series
// is its first one's (k8s.io/client-go/tools/events, getKey). So what tells
// occurrences apart (container, exit code, delay) is in the action too, and
// a series never shows one hold's delay for another's.

func (r *Reporter) event(pod kubeapi.PodRef, typ, reason, action, note string) {
	r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: typ, Reason: reason, Action: action, Note: note})
}

func exitOf(t restartapi.Trigger) string { return fmt.Sprintf("%s exited %d", t.Container, t.ExitCode) }

// RestartStarted: the pod goes not Ready, AllContainersRestarting True for
// a whole-pod restart, and events for the restart and its backoff hold.
func (r *Reporter) RestartStarted(p restartapi.PodRef, t restartapi.Trigger) {
	pod, now := ref(p), r.now()
	all := t.Action == string(podspec.ActionRestartAllContainers)
	exit := fmt.Sprintf("container %s exited with code %d", t.Container, t.ExitCode)
	what := "restarting all containers in place"
	if !all {
		what = "restarting it in place"
	}
	reason, msg := "RestartInProgress", exit+"; "+what
	if t.Delay > 0 {
		reason, msg = "BackoffHold", fmt.Sprintf("%s; %s after a %s backoff", exit, what, t.Delay)
	}
	r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionFalse, Reason: reason, Message: msg, At: now})
	if all {
		r.setRestarting(pod, kubeapi.Condition{Status: corev1.ConditionTrue, Reason: ReasonAllContainersRestarting, Message: msg, At: now})
	}
	evReason := "RestartContainerInPlace"
	if all {
		evReason = "RestartAllContainersInPlace"
	}
	r.event(pod, corev1.EventTypeNormal, evReason, "Restart ("+exitOf(t)+")", exit+"; "+what)
	if t.Delay > 0 {
		r.event(pod, corev1.EventTypeWarning, "BackOff", fmt.Sprintf("Hold %s (%s)", t.Delay, exitOf(t)),
			fmt.Sprintf("Back-off %s restarting failed container %s (exit code %d)", t.Delay, t.Container, t.ExitCode))
	}
}

// RestartEnded: the pod is Ready again (as far as the shim is concerned)
// and AllContainersRestarting False once the restarted containers run.
func (r *Reporter) RestartEnded(p restartapi.PodRef, t restartapi.Trigger, out restartapi.Outcome) {
	pod, now := ref(p), r.now()
	all := t.Action == string(podspec.ActionRestartAllContainers)
	switch out {
	case restartapi.RestartedAgain:
		// The next restart's RestartStarted already set the conditions.
		r.event(pod, corev1.EventTypeNormal, "RestartedInPlace", "Restarted ("+exitOf(t)+")",
			fmt.Sprintf("restarted in place after container %s exited with code %d; a restarted container exited again", t.Container, t.ExitCode))
		return
	case restartapi.Abandoned:
		// The pod is being stopped: it stays not Ready.
		if all {
			r.setRestarting(pod, kubeapi.Condition{Status: corev1.ConditionFalse, Reason: "RestartAbandoned", Message: "the pod is being stopped", At: now})
		}
		r.event(pod, corev1.EventTypeNormal, "RestartAbandoned", "Abandon ("+exitOf(t)+")",
			fmt.Sprintf("in-place restart after container %s exited with code %d given up: the pod is being stopped", t.Container, t.ExitCode))
		return
	}
	r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionTrue, At: now})
	if all {
		r.setRestarting(pod, kubeapi.Condition{Status: corev1.ConditionFalse, At: now})
	}
	r.event(pod, corev1.EventTypeNormal, "RestartedInPlace", "Restarted ("+exitOf(t)+")",
		fmt.Sprintf("containers running again after container %s exited with code %d", t.Container, t.ExitCode))
}

// WarmRestart: an event for each container of a pod asking for warm
// restarts, restored from its checkpoint (Normal) or started cold (Warning,
// with the reason).
func (r *Reporter) WarmRestart(p restartapi.PodRef, w restartapi.WarmResult) {
	pod := ref(p)
	if w.Cold != "" {
		r.event(pod, corev1.EventTypeWarning, "WarmRestartFallback", "Cold start ("+w.Container+")",
			fmt.Sprintf("container %s started cold: %s", w.Container, w.Cold))
		return
	}
	r.event(pod, corev1.EventTypeNormal, "WarmRestarted", "Restore ("+w.Container+")",
		fmt.Sprintf("container %s restored from checkpoint %s, taken %s before", w.Container, w.Checkpoint, w.Age.Round(time.Second)))
}

// sandboxStarted: a new sandbox of an annotated pod has no restart in
// progress, so its readiness gate is True (a gate with no condition counts
// as False and would keep the pod from ever being Ready); annotations the
// shim refuses get a Warning event each.
func (r *Reporter) sandboxStarted(pod kubeapi.PodRef, ann map[string]string, spec podspec.Spec) {
	if !podspec.Annotated(ann) {
		return
	}
	r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionTrue, At: r.now()})
	// One event per annotation, so that each event's action names its key.
	for _, p := range spec.Problems {
		switch p.Feature {
		case podspec.FeaturePodManagement:
			r.event(pod, corev1.EventTypeWarning, "InvalidPodManagement", "Ignore "+p.Key, p.Message+"; the pod runs without a pod management channel")
		default:
			r.event(pod, corev1.EventTypeWarning, "InvalidRestartRules", "Ignore "+p.Key, p.Message)
		}
	}
}
