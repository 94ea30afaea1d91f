package backoff

import (
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
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
