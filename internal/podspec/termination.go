package podspec

import "fmt"

// Termination is a pod's choice of TerminationKey.
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

// ParseTermination reads a pod's TerminationKey. An absent annotation is
// graceful; any other value than the two known ones is a problem, returned
// to be logged, counted and shown like a restart-rules problem, and the pod
// keeps the graceful default.
func ParseTermination(annotations map[string]string) (Termination, string) {
	v, ok := annotations[TerminationKey]
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
		TerminationKey, quoted, TerminationGraceful, TerminationImmediate)
}
