// Package podstatus tells the API server what the shim does to a pod, so
// that kubectl shows the truth: the AllContainersRestarting condition during
// an in-place restart, the pod not Ready while a container is held by the
// backoff or restarted (the readiness gate ReadyCondition), and events for
// restarts, holds and refused annotations. It hears of restarts from
// podstate (podstate.Observer) and of new pods through the proxy's
// RunPodSandbox hook; everything it writes is queued (internal/kubeapi), so
// no CRI call waits for the API. docs/kubernetes-api.md.
package podstatus

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/podmgmt"
	"github.com/cri-shim/cri-shim/internal/podstate"
)

// ReadyCondition is the readiness gate the shim owns: False from the
// moment a restart rule matches (through the backoff hold and the restart)
// until the restarted containers run, True otherwise. The admission policy
// in deploy/kubernetes adds it to the readinessGates of pods that carry
// cri-shim restart annotations; the kubelet counts it into the pod's Ready
// condition and never writes it itself.
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
}

// New reports through api's writer; it asks api's client whether the
// kubelet owns AllContainersRestarting (Run).
func New(api *kubeapi.API, log *slog.Logger) *Reporter {
	return &Reporter{w: api.Writer, owner: newOwnerCheck(api.Client, log), log: log, now: time.Now}
}

// Run keeps the answer to "does the kubelet own AllContainersRestarting"
// current until ctx is done.
func (r *Reporter) Run(ctx context.Context) { r.owner.run(ctx) }

var _ podstate.Observer = (*Reporter)(nil)

func ref(p podstate.PodRef) kubeapi.PodRef {
	return kubeapi.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// RestartStarted: the pod goes not Ready, AllContainersRestarting True for
// a whole-pod restart, and events for the restart and its backoff hold.
func (r *Reporter) RestartStarted(p podstate.PodRef, t podstate.Trigger) {
	pod, now := ref(p), r.now()
	all := t.Action == string(podstate.ActionRestartAllContainers)
	exit := fmt.Sprintf("container %s exited with code %d", t.Container, t.ExitCode)
	what := "restarting all containers in place"
	if !all {
		what = "restarting it in place"
	}
	reason, note := "RestartInProgress", exit+"; "+what
	if t.Delay > 0 {
		reason, note = "BackoffHold", fmt.Sprintf("%s; %s after a %s backoff", exit, what, t.Delay)
	}
	r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionFalse, Reason: reason, Message: note, At: now})
	if all && r.owner.mayWrite() {
		r.w.SetPodCondition(pod, kubeapi.Condition{Type: corev1.AllContainersRestarting, Status: corev1.ConditionTrue,
			Reason: ReasonAllContainersRestarting, Message: note, At: now})
	}
	evReason := "RestartContainerInPlace"
	if all {
		evReason = "RestartAllContainersInPlace"
	}
	r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeNormal, Reason: evReason, Action: "Restart", Note: exit + "; " + what})
	if t.Delay > 0 {
		r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeWarning, Reason: "BackOff", Action: "Hold",
			Note: fmt.Sprintf("Back-off %s restarting failed container %s (exit code %d)", t.Delay, t.Container, t.ExitCode)})
	}
}

// RestartEnded: the pod is Ready again (as far as the shim is concerned)
// and AllContainersRestarting False once the restarted containers run.
func (r *Reporter) RestartEnded(p podstate.PodRef, t podstate.Trigger, out podstate.Outcome) {
	pod, now := ref(p), r.now()
	all := t.Action == string(podstate.ActionRestartAllContainers)
	took := now.Sub(t.FinishedAt).Round(time.Millisecond)
	switch out {
	case podstate.RestartedAgain:
		// The next restart's RestartStarted already set the conditions.
		r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeNormal, Reason: "RestartedInPlace", Action: "Restart",
			Note: fmt.Sprintf("restarted in place after container %s exited with code %d; a restarted container exited again", t.Container, t.ExitCode)})
		return
	case podstate.Abandoned:
		// The pod is being stopped: it stays not Ready.
		if all && r.owner.mayWrite() {
			r.w.SetPodCondition(pod, kubeapi.Condition{Type: corev1.AllContainersRestarting, Status: corev1.ConditionFalse,
				Reason: "RestartAbandoned", Message: "the pod is being stopped", At: now})
		}
		r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeNormal, Reason: "RestartAbandoned", Action: "Restart",
			Note: fmt.Sprintf("in-place restart after container %s exited with code %d given up: the pod is being stopped", t.Container, t.ExitCode)})
		return
	}
	r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionTrue, At: now})
	if all && r.owner.mayWrite() {
		r.w.SetPodCondition(pod, kubeapi.Condition{Type: corev1.AllContainersRestarting, Status: corev1.ConditionFalse, At: now})
	}
	r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeNormal, Reason: "RestartedInPlace", Action: "Restart",
		Note: fmt.Sprintf("containers running again %s after container %s exited with code %d", took, t.Container, t.ExitCode)})
}

// annotated reports whether the pod carries annotations the admission
// policy adds the readiness gate for.
func annotated(ann map[string]string) bool {
	for k := range ann {
		if strings.HasPrefix(k, podstate.RulesAnnotationPrefix) || strings.HasPrefix(k, podmgmt.AnnotationPrefix) {
			return true
		}
	}
	return false
}

// sandboxStarted: a new sandbox of an annotated pod has no restart in
// progress, so its readiness gate is True (a gate with no condition counts
// as False and would keep the pod from ever being Ready); annotations the
// shim refuses get a Warning event each.
func (r *Reporter) sandboxStarted(pod kubeapi.PodRef, ann map[string]string) {
	if !annotated(ann) {
		return
	}
	r.w.SetPodCondition(pod, kubeapi.Condition{Type: ReadyCondition, Status: corev1.ConditionTrue, At: r.now()})
	_, problems := podstate.ParseRules(ann)
	for _, pr := range problems {
		r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeWarning, Reason: "InvalidRestartRules", Action: "IgnoreRules", Note: pr})
	}
	_, problems = podmgmt.ParseAnnotations(ann)
	for _, pr := range problems {
		r.w.Event(kubeapi.Event{Regarding: kubeapi.PodObject(pod), Type: corev1.EventTypeWarning, Reason: "InvalidPodManagement", Action: "IgnoreChannel",
			Note: pr + "; the pod runs without a pod management channel"})
	}
}
