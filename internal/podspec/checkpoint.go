package podspec

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultWarmRestartMaxAge is the oldest checkpoint a warm restart
	// uses when the pod gives no WarmRestartMaxAgeKey.
	DefaultWarmRestartMaxAge = time.Hour
	// MaxWarmRestartMaxAge is the most WarmRestartMaxAgeKey may say.
	MaxWarmRestartMaxAge = 7 * 24 * time.Hour
	// DefaultKeep is how many scheduled checkpoints a pod keeps without
	// KeepKey; MaxKeep the most it may ask.
	DefaultKeep = 2
	MaxKeep     = 100 // the most KeepKey may ask
	// MaxInterval is the longest IntervalKey.
	MaxInterval = 7 * 24 * time.Hour
)

// ParseWarmRestart reads a pod's warm-restart annotations: whether it asks
// for warm restarts, and the oldest checkpoint it accepts. A value other
// than "true" or "false", or a malformed or out-of-range age, is an error
// naming the annotation (the restart is then cold, and the event says so).
func ParseWarmRestart(ann map[string]string) (bool, time.Duration, error) {
	v, ok := ann[WarmRestartKey]
	if !ok {
		return false, 0, nil
	}
	switch strings.TrimSpace(v) {
	case "true":
	case "false", "":
		return false, 0, nil
	default:
		return false, 0, fmt.Errorf("%s: %q is not true or false", WarmRestartKey, truncate(v, 32))
	}
	age := DefaultWarmRestartMaxAge
	if a, ok := ann[WarmRestartMaxAgeKey]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(a))
		if err != nil || d < time.Second || d > MaxWarmRestartMaxAge {
			return false, 0, fmt.Errorf("%s: %q is not a duration from 1s to %s", WarmRestartMaxAgeKey, truncate(a, 32), MaxWarmRestartMaxAge)
		}
		age = d
	}
	return true, age, nil
}

// Schedule is a pod's checkpoint schedule.
type Schedule struct {
	Interval time.Duration
	Keep     int
}

// ParseSchedule reads a pod's schedule annotations: nil without an interval.
// An interval under minInterval (the node's) is raised to it. A malformed
// value is an error naming the annotation; the pod is then not checkpointed.
func ParseSchedule(ann map[string]string, minInterval time.Duration) (*Schedule, error) {
	v, ok := ann[IntervalKey]
	if !ok {
		return nil, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 || d > MaxInterval {
		return nil, fmt.Errorf("%s: %q is not a duration from 1s to %s", IntervalKey, truncate(v, 32), MaxInterval)
	}
	s := &Schedule{Interval: max(d, minInterval), Keep: DefaultKeep}
	if k, ok := ann[KeepKey]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil || n < 1 || n > MaxKeep {
			return nil, fmt.Errorf("%s: %q is not a count from 1 to %d", KeepKey, truncate(k, 32), MaxKeep)
		}
		s.Keep = n
	}
	return s, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
