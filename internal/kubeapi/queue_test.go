package kubeapi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func statusItem(uid string, t corev1.PodConditionType, s corev1.ConditionStatus) *item {
	return &item{key: "pod/" + uid, kind: kindStatus, pod: PodRef{UID: uid},
		conds: map[string]Condition{string(t): {Type: t, Status: s}}}
}

func TestQueueCoalescesConditionsOfOnePod(t *testing.T) {
	q := newQueue(10, func(kind) { t.Fatal("nothing should be dropped") })
	q.put(statusItem("a", "X", corev1.ConditionTrue))
	q.put(statusItem("b", "X", corev1.ConditionTrue))
	q.put(statusItem("a", "Y", corev1.ConditionTrue))
	q.put(statusItem("a", "X", corev1.ConditionFalse))
	if q.len() != 2 {
		t.Fatalf("%d items, want 2 (one per pod)", q.len())
	}
	a := q.take()
	if a.pod.UID != "a" || len(a.conds) != 2 || a.conds["X"].Status != corev1.ConditionFalse || a.conds["Y"].Status != corev1.ConditionTrue {
		t.Fatalf("pod a keeps its place and merges, newest per type: %+v", a)
	}
	if b := q.take(); b.pod.UID != "b" {
		t.Fatalf("second item %+v", b)
	}
	if q.take() != nil {
		t.Fatal("queue should be empty")
	}
}

func TestQueueDropsOldestWhenFull(t *testing.T) {
	var dropped []kind
	q := newQueue(2, func(k kind) { dropped = append(dropped, k) })
	q.put(&item{key: "event/1", kind: kindEvent})
	q.put(statusItem("a", "X", corev1.ConditionTrue))
	q.put(&item{key: "op/x", kind: kindOp})
	if len(dropped) != 1 || dropped[0] != kindEvent {
		t.Fatalf("dropped %v, want the oldest (an event)", dropped)
	}
	if it := q.take(); it.key != "pod/a" {
		t.Fatalf("oldest kept is %q", it.key)
	}
}

func TestQueuePutBackYieldsToNewerValues(t *testing.T) {
	q := newQueue(10, func(kind) {})
	failed := statusItem("a", "X", corev1.ConditionTrue)
	failed.conds["Y"] = Condition{Type: "Y", Status: corev1.ConditionTrue}
	failed.tries = 3
	q.put(statusItem("b", "X", corev1.ConditionTrue))
	q.put(statusItem("a", "X", corev1.ConditionFalse)) // queued while the write of failed was in flight
	q.putBack(failed)
	if first := q.take(); first.pod.UID != "b" {
		t.Fatalf("a newer item of the key keeps its place; first is %q", first.key)
	}
	a := q.take()
	if a.conds["X"].Status != corev1.ConditionFalse || a.conds["Y"].Status != corev1.ConditionTrue || a.tries != 3 {
		t.Fatalf("merged item %+v: want X False (newer), Y True (kept), tries 3", a)
	}

	q.putBack(failed)
	q.put(statusItem("c", "X", corev1.ConditionTrue))
	if first := q.take(); first != failed {
		t.Fatalf("a failed item with no newer one goes first, got %q", first.key)
	}
}
