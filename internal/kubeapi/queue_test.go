package kubeapi

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func statusItem(uid string, t corev1.PodConditionType, s corev1.ConditionStatus) *item {
	return &item{key: "pod/" + uid, kind: kindStatus, pod: PodRef{UID: uid},
		conds: map[string]Condition{string(t): {Type: t, Status: s}}}
}

func testQueue(t *testing.T, max int, dropped func(kind)) *queue {
	q := newQueue(max, time.Millisecond, 10*time.Millisecond, dropped)
	t.Cleanup(q.shutDown)
	return q
}

// mustTake takes the next item, failing the test if it does not come.
func mustTake(t *testing.T, q *queue) *item {
	t.Helper()
	got := make(chan *item, 1)
	go func() {
		for {
			_, it, ok := q.take()
			if !ok || it != nil {
				got <- it
				return
			}
		}
	}()
	select {
	case it := <-got:
		if it == nil {
			t.Fatal("queue shut down")
		}
		return it
	case <-time.After(5 * time.Second):
		t.Fatal("no item")
	}
	return nil
}

func TestQueueCoalescesConditionsOfOnePod(t *testing.T) {
	q := testQueue(t, 10, func(kind) { t.Fatal("nothing should be dropped") })
	q.put(statusItem("a", "X", corev1.ConditionTrue))
	q.put(statusItem("b", "X", corev1.ConditionTrue))
	q.put(statusItem("a", "Y", corev1.ConditionTrue))
	q.put(statusItem("a", "X", corev1.ConditionFalse))
	if q.len() != 2 {
		t.Fatalf("%d items, want 2 (one per pod)", q.len())
	}
	a := mustTake(t, q)
	if a.pod.UID != "a" || len(a.conds) != 2 || a.conds["X"].Status != corev1.ConditionFalse || a.conds["Y"].Status != corev1.ConditionTrue {
		t.Fatalf("pod a keeps its place and merges, newest per type: %+v", a)
	}
	q.done(a)
	if b := mustTake(t, q); b.pod.UID != "b" {
		t.Fatalf("second item %+v", b)
	} else {
		q.done(b)
	}
	if q.len() != 0 {
		t.Fatalf("%d left, want none", q.len())
	}
}

// The bound counts the item in hand; a new key beyond it is dropped, a
// write of a pending key still merges.
func TestQueueDropsNewKeysWhenFull(t *testing.T) {
	var dropped []kind
	q := testQueue(t, 2, func(k kind) { dropped = append(dropped, k) })
	q.put(statusItem("a", "X", corev1.ConditionTrue))
	a := mustTake(t, q)
	q.put(statusItem("b", "X", corev1.ConditionTrue))
	q.put(&item{key: "event/1", kind: kindEvent})
	q.put(statusItem("b", "Y", corev1.ConditionTrue))
	if len(dropped) != 1 || dropped[0] != kindEvent {
		t.Fatalf("dropped %v, want the event (a and b fill the bound)", dropped)
	}
	q.done(a)
	if b := mustTake(t, q); b.pod.UID != "b" || len(b.conds) != 2 {
		t.Fatalf("b merged: %+v", b)
	}
}

// A failed item comes back after its key's backoff; a newer item of its key
// queued meanwhile merges into it, its values winning.
func TestQueueRetryYieldsToNewerValues(t *testing.T) {
	q := testQueue(t, 10, func(kind) {})
	q.put(statusItem("a", "X", corev1.ConditionTrue))
	failed := mustTake(t, q)
	failed.conds["Y"] = Condition{Type: "Y", Status: corev1.ConditionTrue}
	failed.tries = 3
	q.put(statusItem("a", "X", corev1.ConditionFalse)) // queued while the write of failed was in flight
	q.retry(failed)
	a := mustTake(t, q)
	if a.conds["X"].Status != corev1.ConditionFalse || a.conds["Y"].Status != corev1.ConditionTrue || a.tries != 3 {
		t.Fatalf("merged item %+v: want X False (newer), Y True (kept), tries 3", a)
	}
	q.done(a)

	q.put(statusItem("c", "X", corev1.ConditionTrue))
	c := mustTake(t, q)
	q.retry(c)
	start := time.Now()
	if again := mustTake(t, q); again != c {
		t.Fatalf("the failed item comes back, got %q", again.key)
	}
	if d := time.Since(start); d < time.Millisecond {
		t.Fatalf("retried after %s, before the key's backoff of 1ms", d)
	}
}
