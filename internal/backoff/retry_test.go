package backoff

import (
	"testing"
	"time"
)

// Retry's waits start at min, double up to max, and are jittered: never
// below the curve, never more than half again above it, and not all alike.
func TestRetryDoublesToItsCapWithJitter(t *testing.T) {
	min, max := 100*time.Millisecond, time.Second
	curve := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	seen := map[time.Duration]bool{}
	for run := 0; run < 50; run++ {
		b := Retry(min, max)
		for i, c := range curve {
			c *= time.Millisecond
			d := b.Step()
			if d < c || d > c+c/2 {
				t.Fatalf("wait %d is %v, want %v to %v", i, d, c, c+c/2)
			}
			if i == 0 {
				seen[d] = true
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("50 first waits took %d values: not jittered", len(seen))
	}
}

// RetryLimiter gives a key Retry's curve, jittered, and Forget starts the
// key over; keys do not share a position.
func TestRetryLimiterFollowsTheCurvePerKey(t *testing.T) {
	l := RetryLimiter(100*time.Millisecond, 400*time.Millisecond)
	for i, c := range []time.Duration{100, 200, 400, 400} {
		c *= time.Millisecond
		if d := l.When("a"); d < c || d > c+c/2 {
			t.Fatalf("retry %d of a waits %v, want %v to %v", i, d, c, c+c/2)
		}
	}
	if d := l.When("b"); d > 150*time.Millisecond {
		t.Fatalf("first retry of b waits %v: keys share a position", d)
	}
	l.Forget("a")
	if d := l.When("a"); d > 150*time.Millisecond {
		t.Fatalf("retry of a after Forget waits %v", d)
	}
}
