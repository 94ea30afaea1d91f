package kubeapi

import (
	"strconv"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Event is one event the shim reports (events.k8s.io/v1).
type Event struct {
	// Regarding is the object the event is about (PodObject for a pod).
	Regarding corev1.ObjectReference
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason is a short UpperCamelCase cause (at most 128 characters).
	Reason string
	// Action is what the shim did or failed to do (at most 128 characters).
	Action string
	// Note is for humans (at most 1 kB; longer is cut).
	Note string
}

// maxNote is the API's limit on an event's note.
const maxNote = 1024

var eventSeq atomic.Uint64

// Event queues e. Events are never coalesced in the queue; the recorder
// aggregates repeats of the same object, type, reason and action into one
// Event with a series count, as the kubelet's recorder does (recorder.go).
func (w *Writer) Event(e Event) {
	if w == nil {
		return
	}
	e.Note = truncate(e.Note, maxNote)
	e.Reason = truncate(e.Reason, 128)
	e.Action = truncate(e.Action, 128)
	ns := e.Regarding.Namespace
	w.q.put(&item{key: itemKey(kindEvent, ns, strconv.FormatUint(eventSeq.Add(1), 10)), ns: ns, kind: kindEvent, event: &e})
}

// PodObject is the reference to a pod that events about it carry.
func PodObject(p PodRef) corev1.ObjectReference {
	return corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: types.UID(p.UID)}
}
