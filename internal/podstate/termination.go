package podstate

// How a pod's old containers are stopped for an in-place restart, chosen per
// pod: the kubelet's graceful stop (the default) or upstream
// RestartAllContainers' kill without grace period.

import (
	"fmt"
	"time"
)

// TerminationAnnotation chooses how an in-place restart stops the pod's
// running containers: "graceful" (the default) or "immediate".
const TerminationAnnotation = "restart.cri-shim.io/termination"

// Termination is a pod's choice of TerminationAnnotation.
type Termination string

const (
	// TerminationGraceful stops each container as the kubelet stops a pod:
	// its preStop hook, then SIGTERM and SIGKILL after what is left of the
	// pod's termination grace period.
	TerminationGraceful Termination = "graceful"
	// TerminationImmediate stops each container as the kubelet v1.36 does for
	// its native RestartAllContainers (kuberuntime_manager.go, SyncPod: a
	// killContainer with a grace period override of 0): no preStop hook, and
	// StopContainer with the kubelet's minimum shutdown window.
	TerminationImmediate Termination = "immediate"
)

// immediateWindow is the StopContainer timeout of an immediate termination:
// the kubelet's minimumGracePeriodInSeconds (kuberuntime_manager.go), which
// its killContainer applies to a grace period override of 0, so SIGTERM is
// followed by SIGKILL after 2 s.
const immediateWindow = 2 * time.Second

// maxQuoted bounds how much of a pod's invalid value a problem repeats.
const maxQuoted = 64

// ParseTermination reads a pod's TerminationAnnotation. An absent annotation
// is graceful; any other value than the two known ones is a problem, returned
// to be logged, counted and shown like a restart-rules problem, and the pod
// keeps the graceful default.
func ParseTermination(annotations map[string]string) (Termination, string) {
	v, ok := annotations[TerminationAnnotation]
	if !ok {
		return TerminationGraceful, ""
	}
	switch t := Termination(v); t {
	case TerminationGraceful, TerminationImmediate:
		return t, ""
	}
	quoted := fmt.Sprintf("%.*q", maxQuoted, v)
	if len([]rune(v)) > maxQuoted {
		quoted += fmt.Sprintf(" (truncated, %d bytes)", len(v))
	}
	return TerminationGraceful, fmt.Sprintf("annotation %s: unknown value %s (want %q or %q; graceful termination applies)",
		TerminationAnnotation, quoted, TerminationGraceful, TerminationImmediate)
}

// stopTimeout is the StopContainer timeout of one instance: for a graceful
// termination what its preStop hook, which took ran, left of the pod's grace
// period, counting the hook in whole seconds as the kubelet does
// (executePreStopHook returns the seconds it took, truncated: a hook of 0.3 s
// leaves a 30 s grace period 30 s); for an immediate one the kubelet's
// minimum window, or the pod's grace period if that is shorter.
func stopTimeout(t Termination, grace, ran time.Duration) time.Duration {
	if t == TerminationImmediate {
		return min(grace, immediateWindow)
	}
	return max(grace-ran.Truncate(time.Second), 0)
}
