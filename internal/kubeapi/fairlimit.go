package kubeapi

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
)

var _ flowcontrol.RateLimiter = (*fairLimiter)(nil)

// fairLimiter is the node's token bucket for its requests to the API
// server ([kubernetes] qps and burst), shared by every client the shim
// makes (client.go), with turns given fairly: client-go's own bucket
// (k8s.io/client-go/util/flowcontrol/throttle.go, on golang.org/x/time/rate,
// whose Wait reserves the next free token) serves its waiters in the order
// they came, so a namespace with many
// requests in flight (status writes of its PodCheckpoints, reads of its
// pods' pull secrets) delays every other namespace's by its whole backlog.
// Here a request waits in its share (share.go): pod status writes before
// all others, then round-robin over namespaces, one request each in turn,
// in order within a namespace. A request that finds no one waiting and a
// token left is not delayed, as with client-go's bucket.
//
// client-go waits on the bucket with the request's context
// (k8s.io/client-go/rest/request.go, tryThrottleWithInfo), which is where
// the share is read.
type fairLimiter struct {
	qps   float64
	burst float64
	// now and afterFunc are the clock (tests replace them).
	now       func() time.Time
	afterFunc func(time.Duration, func()) (stop func() bool)

	mu     sync.Mutex
	tokens float64
	last   time.Time // when tokens was last brought up to date
	// classes are the waiters: [0] pod status writes, [1] the rest.
	classes [2]roundRobin[*waiter]
	armed   bool // a dispatch is scheduled
}

type waiter struct {
	ready   chan struct{}
	granted bool
	ns      string
	class   int
}

// newFairLimiter makes a bucket of qps (> 0; config.Validate) and burst.
func newFairLimiter(qps float32, burst int) *fairLimiter {
	burst = max(burst, 1)
	l := &fairLimiter{qps: float64(qps), burst: float64(burst), now: time.Now,
		afterFunc: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
	l.tokens, l.last = l.burst, l.now()
	return l
}

// refill brings tokens up to date. l.mu held.
func (l *fairLimiter) refill() {
	now := l.now()
	l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.qps)
	l.last = now
}

func (l *fairLimiter) waiting() bool {
	return l.classes[0].len() > 0 || l.classes[1].len() > 0
}

// Wait waits for ctx's share's turn and a token.
func (l *fairLimiter) Wait(ctx context.Context) error {
	s := shareOf(ctx)
	l.mu.Lock()
	l.refill()
	if !l.waiting() && l.tokens >= 1 {
		l.tokens--
		l.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{}), ns: s.namespace, class: 1}
	if s.podStatus {
		w.class = 0
	}
	l.classes[w.class].push(w.ns, w)
	l.schedule()
	l.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		l.tokens = min(l.burst, l.tokens+1) // not used: the next waiter's
		l.grant()
	} else {
		l.classes[w.class].remove(w.ns, func(x *waiter) bool { return x == w })
	}
	return ctx.Err()
}

// grant hands the tokens there are to the waiters whose turn it is, and
// schedules the next grant if waiters remain. l.mu held.
func (l *fairLimiter) grant() {
	l.refill()
	for l.tokens >= 1 {
		w := l.next()
		if w == nil {
			return
		}
		l.tokens--
		w.granted = true
		close(w.ready)
	}
	l.schedule()
}

// next takes the waiter whose turn it is: in the highest class with
// waiters, the first of the namespace whose turn it is. l.mu held.
func (l *fairLimiter) next() *waiter {
	for i := range l.classes {
		if w, ok := l.classes[i].pop(); ok {
			return w
		}
	}
	return nil
}

// schedule arranges a grant for when the next token is due, if waiters
// remain and none is arranged. l.mu held.
func (l *fairLimiter) schedule() {
	if l.armed || !l.waiting() {
		return
	}
	l.armed = true
	d := time.Duration((1 - l.tokens) / l.qps * float64(time.Second))
	l.afterFunc(max(d, time.Millisecond), func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.armed = false
		l.grant()
	})
}

// TryAccept takes a token if one is there and no one waits.
func (l *fairLimiter) TryAccept() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refill()
	if l.waiting() || l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// Accept waits for a token in the node's own share.
func (l *fairLimiter) Accept() { _ = l.Wait(context.Background()) }

// Stop does nothing: no goroutine runs between grants.
func (l *fairLimiter) Stop() {}

// QPS is the bucket's rate.
func (l *fairLimiter) QPS() float32 { return float32(l.qps) }
