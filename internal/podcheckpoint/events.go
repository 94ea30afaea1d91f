package podcheckpoint

import (
	corev1 "k8s.io/api/core/v1"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// EventSink reports an event (KEP-5823's reasons) about an object; it must
// not block (internal/kubeapi's Writer queues it). nil drops events.
type EventSink func(regarding corev1.ObjectReference, eventType, reason, note string)

// KEP-5823's event reasons on a PodCheckpoint.
const (
	EventCheckpointStarted   = "CheckpointStarted"
	EventCheckpointSucceeded = "CheckpointSucceeded"
	EventCheckpointFailed    = "CheckpointFailed"
)

func (e EventSink) emit(ref corev1.ObjectReference, eventType, reason, note string) {
	if e != nil {
		e(ref, eventType, reason, note)
	}
}

func objectRef(pc *cpv1.PodCheckpoint) corev1.ObjectReference {
	return corev1.ObjectReference{APIVersion: cpv1.SchemeGroupVersion.String(), Kind: "PodCheckpoint",
		Namespace: pc.Namespace, Name: pc.Name, UID: pc.UID}
}
