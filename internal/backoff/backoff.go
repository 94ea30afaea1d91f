// Package backoff is the restart backoff curve of KEP-4603 ("Tune
// CrashLoopBackoff") for every restart cri-shim governs: an exponential curve
// from an initial delay (default 1 s) doubling to a maximum (default 60 s), a
// per-node maximum an operator may set between 1 and 300 s, and a flat
// 10-minute reset: a container (or pod) that ran 10 minutes without exiting
// starts the curve again. Unlike the kubelet before k/k#123602 was fixed, the
// first restart waits the initial delay too.
package backoff

import (
	"fmt"
	"sync"
	"time"
)

// ResetAfter is the uninterrupted run time after which the curve starts over.
const ResetAfter = 10 * time.Minute

// Node maximum limits, as for the kubelet's crashLoopBackOff.maxContainerRestartPeriod.
const (
	MinNodeMax = 1 * time.Second
	MaxNodeMax = 300 * time.Second
)

// Curve is an effective initial delay and maximum.
type Curve struct {
	Initial time.Duration
	Max     time.Duration
}

// Resolve applies KEP-4603's conflict resolution to a configuration: with no
// node maximum (nodeMax == 0) the curve is initial..defaultMax; with one, it
// must lie in [1 s, 300 s], it replaces the maximum (even above the default),
// and an initial delay above it is lowered to it.
func Resolve(initial, defaultMax, nodeMax time.Duration) (Curve, error) {
	if initial <= 0 {
		return Curve{}, fmt.Errorf("initial delay must be positive, got %s", initial)
	}
	if defaultMax < initial {
		return Curve{}, fmt.Errorf("maximum delay %s is below the initial delay %s", defaultMax, initial)
	}
	if nodeMax == 0 {
		return Curve{Initial: initial, Max: defaultMax}, nil
	}
	if nodeMax < MinNodeMax || nodeMax > MaxNodeMax {
		return Curve{}, fmt.Errorf("node maximum must be between %s and %s, got %s", MinNodeMax, MaxNodeMax, nodeMax)
	}
	c := Curve{Initial: initial, Max: nodeMax}
	if c.Initial > nodeMax {
		c.Initial = nodeMax
	}
	return c, nil
}

// Delay is the wait before the n-th restart (n >= 1) since the curve last reset.
func (c Curve) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := c.Initial
	for i := 1; i < n; i++ {
		d *= 2
		if d >= c.Max {
			return c.Max
		}
	}
	if d > c.Max {
		return c.Max
	}
	return d
}

// Clock is the time source; tests inject a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Key names what restarts: a container of a pod, or (Container == "") the whole pod.
// The curve belongs to the pod (its UID), not to one of its sandboxes: a
// sandbox the kubelet creates again for the same pod continues it, as the
// kubelet's own CrashLoopBackOff does (keyed by pod and container).
type Key struct {
	PodUID    string
	Container string
}

// State is what the tracker knows of one key.
type State struct {
	Restarts  int           // restarts since the curve last reset
	LastDelay time.Duration // delay applied to the latest restart
	NotBefore time.Time     // the latest restart may not happen before this
}

// Tracker keeps the curve position per key. It is safe for concurrent use; it
// is touched once per restart, never on the CRI hot path.
//
// Each key is owned by the sandbox that last restarted under it (Exited,
// Restore): removing a sandbox forgets only the keys it owns, so removing an
// old sandbox of a pod never resets the curve of the pod's live sandbox.
type Tracker struct {
	curve Curve
	clock Clock

	mu      sync.Mutex
	entries map[Key]*entry
}

type entry struct {
	State
	owner string // sandbox that last restarted under the key
}

// NewTracker returns a tracker for curve c using clock (nil: the wall clock).
func NewTracker(c Curve, clock Clock) *Tracker {
	if clock == nil {
		clock = RealClock
	}
	return &Tracker{curve: c, clock: clock, entries: map[Key]*entry{}}
}

// Exited records that key's process (or pod) ran from started to finished in
// sandbox owner and must now be restarted; owner takes the key over. It
// returns the delay and the earliest time of the restart: finished plus the
// delay. A run of ResetAfter or more resets the curve first.
func (t *Tracker) Exited(k Key, owner string, started, finished time.Time) State {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e == nil {
		e = &entry{}
		t.entries[k] = e
	}
	e.owner = owner
	s := &e.State
	if !started.IsZero() && finished.Sub(started) >= ResetAfter {
		s.Restarts = 0
	}
	s.Restarts++
	s.LastDelay = t.curve.Delay(s.Restarts)
	s.NotBefore = finished.Add(s.LastDelay)
	return *s
}

// Get returns key's state and owner, if any.
func (t *Tracker) Get(k Key) (s State, owner string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[k]
	if !ok {
		return State{}, "", false
	}
	return e.State, e.owner, true
}

// Restore sets key's state and owner, e.g. from the shim's state directory
// after a restart, or back to what Get returned when a restart could not be
// recorded.
func (t *Tracker) Restore(k Key, owner string, s State) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entries[k] = &entry{State: s, owner: owner}
}

// Drop deletes one key, whoever owns it.
func (t *Tracker) Drop(k Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.entries, k)
}

// Forget drops the keys of pod podUID that sandbox owner owns (the sandbox is
// gone). Keys another sandbox of the pod restarted under since stay.
func (t *Tracker) Forget(podUID, owner string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.entries {
		if k.PodUID == podUID && e.owner == owner {
			delete(t.entries, k)
		}
	}
}
