package podstate

import "time"

// Annotations the kubelet puts on every container it creates
// (pkg/kubelet/kuberuntime/labels.go, kubelet v1.36.3).
const (
	annotationGracePeriod  = "io.kubernetes.pod.terminationGracePeriod"
	annotationPreStop      = "io.kubernetes.container.preStopHandler"
	annotationRestartCount = "io.kubernetes.container.restartCount"
	defaultGracePeriod     = 30 * time.Second
	// maxHold caps how long an instance stays held after a swap when the
	// kubelet does not read it (see Instance.HeldUntil).
	maxHold = time.Minute
)
