package kubeapi

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// testLimiter is a fairLimiter on a clock the test moves: its scheduled
// grant runs when the test calls tick.
type testLimiter struct {
	*fairLimiter
	mu      sync.Mutex
	at      time.Time
	pending func()
	granted chan string
}

func newTestLimiter(qps float32, burst int) *testLimiter {
	tl := &testLimiter{at: time.Unix(1000, 0), granted: make(chan string, 100)}
	l := newFairLimiter(qps, burst)
	l.now = func() time.Time { tl.mu.Lock(); defer tl.mu.Unlock(); return tl.at }
	l.afterFunc = func(_ time.Duration, f func()) func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		tl.pending = f
		return func() bool { return true }
	}
	l.tokens, l.last = l.burst, tl.at
	tl.fairLimiter = l
	return tl
}

// tick moves the clock by d and runs the scheduled grant, if any.
func (tl *testLimiter) tick(d time.Duration) {
	tl.mu.Lock()
	tl.at = tl.at.Add(d)
	f := tl.pending
	tl.pending = nil
	tl.mu.Unlock()
	if f != nil {
		f()
	}
}

func (tl *testLimiter) waiters() int {
	tl.fairLimiter.mu.Lock()
	defer tl.fairLimiter.mu.Unlock()
	return tl.classes[0].len() + tl.classes[1].len()
}

// wait starts a Wait under ctx, named name, and returns once it waits.
func (tl *testLimiter) wait(t *testing.T, ctx context.Context, name string) <-chan error {
	t.Helper()
	before := tl.waiters()
	errc := make(chan error, 1)
	go func() {
		err := tl.Wait(ctx)
		if err == nil {
			tl.granted <- name
		}
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for tl.waiters() == before {
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited", name)
		}
		time.Sleep(time.Millisecond)
	}
	return errc
}

func (tl *testLimiter) next(t *testing.T) string {
	t.Helper()
	tl.tick(time.Second)
	select {
	case n := <-tl.granted:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter granted after a token came")
		return ""
	}
}

func TestFairLimiterTurns(t *testing.T) {
	tl := newTestLimiter(1, 1)
	if !tl.TryAccept() {
		t.Fatal("the burst's token was not there")
	}
	if tl.TryAccept() {
		t.Fatal("a second token within the same instant")
	}
	bg := context.Background()
	a := ForNamespace(bg, "a")
	for _, n := range []string{"a1", "a2", "a3", "a4"} {
		tl.wait(t, a, n)
	}
	tl.wait(t, ForNamespace(bg, "b"), "b1")
	tl.wait(t, bg, "node1")
	tl.wait(t, forPodStatus(bg, "c"), "status-c")
	tl.wait(t, forPodStatus(bg, "a"), "status-a")
	// Pod status writes first (in their own round-robin), then one turn
	// per namespace in the order the namespaces came, each in order.
	want := []string{"status-c", "status-a", "a1", "b1", "node1", "a2", "a3", "a4"}
	for i, w := range want {
		if got := tl.next(t); got != w {
			t.Fatalf("grant %d went to %s, want %s (order %v)", i, got, w, want)
		}
	}
	if n := tl.waiters(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

func TestFairLimiterBurstAndRate(t *testing.T) {
	tl := newTestLimiter(2, 3)
	for i := range 3 {
		if !tl.TryAccept() {
			t.Fatalf("burst token %d missing", i)
		}
	}
	if tl.TryAccept() {
		t.Fatal("a token beyond the burst")
	}
	tl.tick(500 * time.Millisecond) // qps 2: one token
	if !tl.TryAccept() || tl.TryAccept() {
		t.Fatal("want exactly one token after 500 ms at 2 qps")
	}
	tl.tick(time.Hour)
	n := 0
	for tl.TryAccept() {
		n++
	}
	if n != 3 {
		t.Fatalf("after an idle hour %d tokens, want the burst (3)", n)
	}
}

func TestFairLimiterCancel(t *testing.T) {
	tl := newTestLimiter(1, 1)
	tl.TryAccept()
	ctx, cancel := context.WithCancel(ForNamespace(context.Background(), "a"))
	errc := tl.wait(t, ctx, "a1")
	tl.wait(t, ForNamespace(context.Background(), "b"), "b1")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait returned %v", err)
	}
	tl.fairLimiter.mu.Lock()
	ring := append([]string(nil), tl.classes[1].ring...)
	tl.fairLimiter.mu.Unlock()
	if len(ring) != 1 || ring[0] != "b" {
		t.Fatalf("ring after a's only waiter gave up: %v, want [b]", ring)
	}
	if got := tl.next(t); got != "b1" {
		t.Fatalf("grant went to %s", got)
	}
}
