package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
)

var backOff = Event{Regarding: PodObject(podA), Type: corev1.EventTypeWarning, Reason: "BackOff", Action: "Hold", Note: "held 2s"}

func testRecorder(t *testing.T, cs *fake.Clientset) (*recorder, context.Context) {
	r := newRecorder(kubeapitest.Clientset{Interface: cs}, slog.New(slog.DiscardHandler), func(string) {})
	r.retry = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); r.wg.Wait() })
	return r, ctx
}

func events(t *testing.T, cs *fake.Clientset) []eventsv1.Event {
	l, err := cs.EventsV1().Events(podA.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// A series whose Event the API server has dropped (its TTL) is written
// again as a new Event carrying the count.
func TestSeriesOfAGoneEventIsCreatedAgain(t *testing.T) {
	cs := fake.NewClientset()
	r, ctx := testRecorder(t, cs)
	e := backOff
	r.record(ctx, &e)
	r.wg.Wait()
	ev := events(t, cs)
	if len(ev) != 1 || ev[0].Series != nil || ev[0].ReportingInstance != r.instance {
		t.Fatalf("first event %+v", ev)
	}
	if err := cs.EventsV1().Events(podA.Namespace).Delete(ctx, ev[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e = backOff
	r.record(ctx, &e)
	r.wg.Wait()
	ev = events(t, cs)
	if len(ev) != 1 || ev[0].Series == nil || ev[0].Series.Count != 2 || ev[0].Note != backOff.Note {
		t.Fatalf("after the Event was gone: %+v", ev)
	}
}

// A write the API server refuses is dropped; one that fails in transport
// is retried until it goes through.
func TestRecorderRetriesTransportFailuresOnly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		tries int32
		kept  int
	}{
		{"refused", apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", errors.New("no")), 1, 0},
		{"transport", errors.New("connection refused"), 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			var tries atomic.Int32
			cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
				if tries.Add(1) < 3 {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			r, ctx := testRecorder(t, cs)
			e := backOff
			r.record(ctx, &e)
			r.wg.Wait()
			if n := tries.Load(); n != tc.tries || len(events(t, cs)) != tc.kept {
				t.Fatalf("%d tries, %d events; want %d, %d", n, len(events(t, cs)), tc.tries, tc.kept)
			}
		})
	}
}

// Occurrences after the second are counted in memory; the count is
// written when the series ends, and the series is then forgotten.
func TestFinishedSeriesIsWrittenAndForgotten(t *testing.T) {
	cs := fake.NewClientset()
	r, ctx := testRecorder(t, cs)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return now }
	for range 4 {
		e := backOff
		r.record(ctx, &e)
		r.wg.Wait()
	}
	if s := events(t, cs)[0].Series; s == nil || s.Count != 2 {
		t.Fatalf("series written %+v, want the count of 2 only", s)
	}
	now = now.Add(seriesFinish + time.Second)
	r.finishSeries(ctx)
	if s := events(t, cs)[0].Series; s == nil || s.Count != 4 {
		t.Fatalf("finished series %+v, want 4", s)
	}
	if n := len(r.cache); n != 0 {
		t.Fatalf("%d series still cached", n)
	}
}

func TestEventOfUnknownTypeIsNotWritten(t *testing.T) {
	cs := fake.NewClientset()
	r, ctx := testRecorder(t, cs)
	e := backOff
	e.Type = "Fatal"
	r.record(ctx, &e)
	r.wg.Wait()
	if ev := events(t, cs); len(ev) != 0 {
		t.Fatal(fmt.Sprint("written: ", ev))
	}
}

// countingRecorder is testRecorder counting the events it drops, by why.
func countingRecorder(t *testing.T, cs *fake.Clientset) (*recorder, context.Context, func(string) int) {
	r, ctx := testRecorder(t, cs)
	var mu sync.Mutex
	dropped := map[string]int{}
	r.dropped = func(why string) { mu.Lock(); dropped[why]++; mu.Unlock() }
	return r, ctx, func(why string) int { mu.Lock(); defer mu.Unlock(); return dropped[why] }
}

// One object's events pass client-go's spam filter: 25 at once, then none
// until its bucket refills (one per 5 minutes); another object's are not
// held back.
func TestOneObjectsEventsAreRateLimited(t *testing.T) {
	cs := fake.NewClientset()
	r, ctx, dropped := countingRecorder(t, cs)
	for i := range 30 {
		e := backOff
		e.Reason = fmt.Sprintf("Reason%d", i)
		r.record(ctx, &e)
	}
	other := backOff
	other.Regarding = PodObject(PodRef{Namespace: podA.Namespace, Name: "b", UID: "uid-b"})
	r.record(ctx, &other)
	r.wg.Wait()
	byPod := map[string]int{}
	for _, ev := range events(t, cs) {
		byPod[ev.Regarding.Name]++
	}
	if byPod["a"] != spamBurst || byPod["b"] != 1 || dropped("spam") != 30-spamBurst {
		t.Fatalf("written %v, %d dropped as spam; want %d of a, 1 of b, %d dropped", byPod, dropped("spam"), spamBurst, 30-spamBurst)
	}
}

// Events wait for one writer in a bounded queue: while the API server
// holds a write, at most recordQueue wait (and recordNSQueue of one
// namespace), the rest are dropped and counted, and no goroutine is started
// per event.
func TestRecorderQueueIsBounded(t *testing.T) {
	cs := fake.NewClientset()
	release := make(chan struct{})
	var first sync.Once
	cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		first.Do(func() { <-release })
		return false, nil, nil
	})
	r, ctx, dropped := countingRecorder(t, cs)
	goroutines := runtime.NumGoroutine()
	const spaces = 10
	n := recordQueue + 200 // recordQueue/spaces+20 of each namespace, under recordNSQueue
	for i := range n {
		e := backOff
		e.Regarding = PodObject(PodRef{Namespace: fmt.Sprintf("ns%d", i%spaces), Name: fmt.Sprintf("p%d", i), UID: fmt.Sprintf("u%d", i)})
		r.record(ctx, &e)
	}
	// One namespace more than its share.
	for i := range recordNSQueue + 50 {
		e := backOff
		e.Regarding = PodObject(PodRef{Namespace: "flood", Name: fmt.Sprintf("p%d", i), UID: fmt.Sprintf("f%d", i)})
		r.record(ctx, &e)
	}
	if g := runtime.NumGoroutine(); g > goroutines+5 {
		t.Errorf("%d goroutines while %d events wait, %d before", g, n, goroutines)
	}
	close(release)
	r.wg.Wait()
	written := 0
	for i := range spaces {
		l, err := cs.EventsV1().Events(fmt.Sprintf("ns%d", i)).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		written += len(l.Items)
	}
	// The writer took the first before the others were queued, or not;
	// the flood namespace found the queue full.
	if written < recordQueue || written > recordQueue+1 {
		t.Fatalf("%d written of %d; want %d or %d", written, n, recordQueue, recordQueue+1)
	}
	if d := dropped("queue_full"); d != n-written+recordNSQueue+50 {
		t.Fatalf("%d dropped, want %d", d, n-written+recordNSQueue+50)
	}
}

// One namespace's backlog of events neither crowds out another's (its own
// bound) nor delays it beyond a turn: the namespaces take turns.
func TestRecorderNamespacesTakeTurns(t *testing.T) {
	cs := fake.NewClientset()
	release := make(chan struct{})
	var first sync.Once
	var mu sync.Mutex
	var order []string
	cs.PrependReactor("create", "events", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		first.Do(func() { <-release })
		mu.Lock()
		order = append(order, a.GetNamespace())
		mu.Unlock()
		return false, nil, nil
	})
	r, ctx, dropped := countingRecorder(t, cs)
	for i := range recordNSQueue + 10 {
		e := backOff
		e.Regarding = PodObject(PodRef{Namespace: "flood", Name: fmt.Sprintf("p%d", i), UID: fmt.Sprintf("f%d", i)})
		r.record(ctx, &e)
	}
	e := backOff
	e.Regarding = PodObject(PodRef{Namespace: "quiet", Name: "q", UID: "q"})
	r.record(ctx, &e)
	close(release)
	r.wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	at := -1
	for i, ns := range order {
		if ns == "quiet" {
			at = i
		}
	}
	// The writer may hold one flood event (taken before the others came)
	// and then the quiet namespace's turn comes after at most one more.
	if at < 0 || at > 2 {
		t.Fatalf("the quiet namespace's event written at %d of %d (order %v)", at, len(order), order[:min(len(order), 5)])
	}
	if d := dropped("queue_full"); d < 9 || d > 10 {
		t.Fatalf("%d of the flood dropped, want 9 or 10 (its bound %d)", d, recordNSQueue)
	}
}

// A sweep's writes are made without the cache's lock: an event recorded
// while the API server holds the sweep's write is not held up by it.
func TestSweepDoesNotHoldUpRecording(t *testing.T) {
	cs := fake.NewClientset()
	r, ctx := testRecorder(t, cs)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return now }
	for range 3 {
		e := backOff
		r.record(ctx, &e)
		r.wg.Wait()
	}
	hold, held := make(chan struct{}), make(chan struct{})
	cs.PrependReactor("patch", "events", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		close(held)
		<-hold
		return false, nil, nil
	})
	now = now.Add(seriesFinish + time.Second)
	swept := make(chan struct{})
	go func() { r.finishSeries(ctx); close(swept) }()
	<-held
	recorded := make(chan struct{})
	go func() {
		e := backOff
		e.Regarding = PodObject(PodRef{Namespace: podA.Namespace, Name: "b", UID: "uid-b"})
		r.record(ctx, &e)
		close(recorded)
	}()
	select {
	case <-recorded:
	case <-time.After(5 * time.Second):
		t.Fatal("recording waited for the sweep's write")
	}
	close(hold)
	<-swept
	r.wg.Wait()
	if s := events(t, cs); len(s) != 2 {
		t.Fatalf("%d events, want the finished series and the new one", len(s))
	}
}

// An event write waits while a pod status write is pending (both share the
// token bucket, and the readiness gate matters more), and goes once none
// is, or after yieldMax.
func TestEventWritesYieldToStatusWrites(t *testing.T) {
	cs := fake.NewClientset()
	r, ctx := testRecorder(t, cs)
	var pending atomic.Bool
	pending.Store(true)
	// asked counts the writer's looks at the status queue: a third look
	// while one is pending means the writer holds the event and waits.
	var asked atomic.Int32
	r.statusPending = func() bool { asked.Add(1); return pending.Load() }
	r.record(ctx, &backOff)
	deadline := time.Now().Add(5 * time.Second)
	for asked.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the event writer looked at the status writes %d times in 5 s, want it waiting on them", asked.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if n := len(events(t, cs)); n != 0 {
		t.Fatalf("%d events written while a status write was pending", n)
	}
	pending.Store(false)
	deadline = time.Now().Add(5 * time.Second)
	for len(events(t, cs)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the event was not written once no status write was pending")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A status write that never ends holds an event back yieldMax at most.
	pending.Store(true)
	now := time.Now()
	r.now = func() time.Time { now = now.Add(time.Second); return now }
	e := backOff
	e.Reason = "Other"
	r.record(ctx, &e)
	deadline = time.Now().Add(5 * time.Second)
	for len(events(t, cs)) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("an event waited for a pending status write past yieldMax")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The queue counts the status writes pending or in hand: one merged into a
// retried one counts once, and done ends it.
func TestQueueCountsPendingStatusWrites(t *testing.T) {
	q := testQueue(t, 10, func(kind) {})
	if q.statusPending() {
		t.Fatal("an empty queue has a status write pending")
	}
	q.put(statusItem("a", "X", corev1.ConditionTrue))
	a := mustTake(t, q)
	if !q.statusPending() {
		t.Fatal("a status write in hand is not pending")
	}
	q.put(statusItem("a", "Y", corev1.ConditionTrue))
	q.retry(a) // merges with the newer item of its key
	a = mustTake(t, q)
	q.done(a)
	if q.statusPending() {
		t.Fatalf("a status write still counted after done (%d)", q.statuses)
	}
}
