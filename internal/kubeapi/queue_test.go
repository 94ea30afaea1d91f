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

func nsStatusItem(ns, uid string) *item {
	return &item{key: itemKey(kindStatus, ns, uid), ns: ns, kind: kindStatus, pod: PodRef{Namespace: ns, UID: uid},
		conds: map[string]Condition{"X": {Type: "X", Status: corev1.ConditionTrue}}}
}

func nsEventItem(ns, id string) *item {
	return &item{key: itemKey(kindEvent, ns, id), ns: ns, kind: kindEvent, event: &Event{}}
}

// Pod status writes are taken before events, and within each the
// namespaces take turns: namespace b's one write comes second however many
// a queued before it.
func TestQueueNamespacesTakeTurnsStatusFirst(t *testing.T) {
	q := testQueue(t, 100, func(kind) {})
	for i := range 3 {
		q.put(nsEventItem("a", string(rune('0'+i))))
	}
	for _, uid := range []string{"a1", "a2", "a3"} {
		q.put(nsStatusItem("a", uid))
	}
	q.put(nsEventItem("b", "0"))
	q.put(nsStatusItem("b", "b1"))
	var got []string
	for range 8 {
		it := mustTake(t, q)
		got = append(got, it.key)
		q.done(it)
	}
	want := []string{"pod/a/a1", "pod/b/b1", "pod/a/a2", "pod/a/a3", "event/a/0", "event/b/0", "event/a/1", "event/a/2"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("taken in order %v, want %v", got, want)
		}
	}
}

// One namespace's events fill at most its share of the queue; another
// namespace's events and every pod status write still find room.
func TestQueueBoundsANamespacesEvents(t *testing.T) {
	var dropped []kind
	q := testQueue(t, 64, func(k kind) { dropped = append(dropped, k) })
	per := q.maxNSEvents() // 4
	for i := range per + 3 {
		q.put(nsEventItem("a", string(rune('a'+i))))
	}
	if len(dropped) != 3 {
		t.Fatalf("%d of namespace a's events dropped, want the 3 beyond its %d", len(dropped), per)
	}
	q.put(nsEventItem("b", "0"))
	q.put(nsStatusItem("a", "a1"))
	if len(dropped) != 3 {
		t.Fatalf("b's event or a's status write dropped: %v", dropped)
	}
	// All namespaces' events together stay under three quarters of it.
	for i := range 64 {
		q.put(nsEventItem("n"+string(rune('a'+i%26))+string(rune('a'+i/26)), "0"))
	}
	if q.events != q.maxEvents() {
		t.Fatalf("%d events queued, want the bound %d", q.events, q.maxEvents())
	}
	for i := range 64 - q.maxEvents() - 1 {
		q.put(nsStatusItem("c", string(rune('a'+i))))
	}
	if n := q.len(); n != 64 {
		t.Fatalf("status writes did not take the room events leave: %d queued of 64", n)
	}
}
