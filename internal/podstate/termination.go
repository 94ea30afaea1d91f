package podstate

// How a pod's old containers are stopped for an in-place restart, chosen per
// pod: the kubelet's graceful stop (the default) or upstream
// RestartAllContainers' kill without grace period.

import (
	"time"

	"github.com/cri-shim/cri-shim/internal/podspec"
)

// immediateWindow is the StopContainer timeout of an immediate termination:
// the kubelet's minimumGracePeriodInSeconds (kuberuntime_manager.go), which
// its killContainer applies to a grace period override of 0, so SIGTERM is
// followed by SIGKILL after 2 s.
const immediateWindow = 2 * time.Second

// stopTimeout is the StopContainer timeout of one instance: for a graceful
// termination what its preStop hook, which took ran, left of the pod's grace
// period, counting the hook in whole seconds as the kubelet does
// (executePreStopHook returns the seconds it took, truncated: a hook of 0.3 s
// leaves a 30 s grace period 30 s); for an immediate one the kubelet's
// minimum window, or the pod's grace period if that is shorter.
func stopTimeout(t podspec.Termination, grace, ran time.Duration) time.Duration {
	if t == podspec.TerminationImmediate {
		return min(grace, immediateWindow)
	}
	return max(grace-ran.Truncate(time.Second), 0)
}
