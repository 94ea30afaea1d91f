package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
)

// Retry is the shim's one backoff for a retried call (an API write, a
// sidecar connection, a status the API server did not take): the first
// wait is min, each next one twice the last up to max, and every wait is
// jittered by up to half again (apimachinery's wait.Backoff), so that the
// nodes of a cluster retrying after one outage do not retry in step.
// Step gives the next wait.
func Retry(min, max time.Duration) *wait.Backoff {
	return &wait.Backoff{Duration: min, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: max}
}

// RetryLimiter is Retry's curve as a work queue's per-key rate limiter
// (client-go's workqueue): a key's n-th retry waits min doubled n times, up
// to max, jittered by up to half again; Forget starts the key over.
func RetryLimiter(min, max time.Duration) workqueue.TypedRateLimiter[string] {
	return jittered{workqueue.NewTypedItemExponentialFailureRateLimiter[string](min, max)}
}

type jittered struct {
	workqueue.TypedRateLimiter[string]
}

func (j jittered) When(key string) time.Duration {
	d := j.TypedRateLimiter.When(key)
	return d + time.Duration(rand.Int64N(int64(d)/2+1))
}

// Sleep waits d, or until ctx is done; it reports whether ctx is still live
// (false: the caller stops).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
