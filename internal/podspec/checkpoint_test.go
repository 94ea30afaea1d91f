package podspec

import (
	"strings"
	"testing"
	"time"
)

func TestParseSchedule(t *testing.T) {
	for _, c := range []struct {
		ann  map[string]string
		want *Schedule
		fail bool
	}{
		{nil, nil, false},
		{map[string]string{KeepKey: "3"}, nil, false},
		{map[string]string{IntervalKey: "10m"}, &Schedule{Interval: 10 * time.Minute, Keep: DefaultKeep}, false},
		{map[string]string{IntervalKey: "1s"}, &Schedule{Interval: 5 * time.Minute, Keep: DefaultKeep}, false},
		{map[string]string{IntervalKey: "1h", KeepKey: " 4 "}, &Schedule{Interval: time.Hour, Keep: 4}, false},
		{map[string]string{IntervalKey: "0s"}, nil, true},
		{map[string]string{IntervalKey: "169h"}, nil, true},
		{map[string]string{IntervalKey: "1h", KeepKey: "0"}, nil, true},
		{map[string]string{IntervalKey: "1h", KeepKey: "101"}, nil, true},
	} {
		got, err := ParseSchedule(c.ann, 5*time.Minute)
		if (err != nil) != c.fail || (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
			t.Errorf("%v: %+v, %v", c.ann, got, err)
		}
	}
}

func FuzzParseSchedule(f *testing.F) {
	f.Add("5m", "2")
	f.Add("-1h", "x")
	f.Add("9999999h", "99999999999999999999")
	f.Fuzz(func(t *testing.T, interval, keep string) {
		s, err := ParseSchedule(map[string]string{IntervalKey: interval, KeepKey: keep}, time.Minute)
		if err != nil {
			if s != nil || len(err.Error()) > 300 {
				t.Fatalf("%+v with %v", s, err)
			}
			return
		}
		if s.Interval < time.Minute || s.Interval > MaxInterval || s.Keep < 1 || s.Keep > MaxKeep {
			t.Fatalf("out of range: %+v", s)
		}
	})
}

func TestParseWarmRestart(t *testing.T) {
	for _, c := range []struct {
		ann  map[string]string
		on   bool
		age  time.Duration
		fail bool
	}{
		{nil, false, 0, false},
		{map[string]string{WarmRestartKey: "true"}, true, DefaultWarmRestartMaxAge, false},
		{map[string]string{WarmRestartKey: " true "}, true, DefaultWarmRestartMaxAge, false},
		{map[string]string{WarmRestartKey: "false", WarmRestartMaxAgeKey: "junk"}, false, 0, false},
		{map[string]string{WarmRestartKey: "true", WarmRestartMaxAgeKey: "10m"}, true, 10 * time.Minute, false},
		{map[string]string{WarmRestartKey: "True"}, false, 0, true},
		{map[string]string{WarmRestartKey: "true", WarmRestartMaxAgeKey: "500ms"}, false, 0, true},
		{map[string]string{WarmRestartKey: "true", WarmRestartMaxAgeKey: "169h"}, false, 0, true},
		{map[string]string{WarmRestartKey: "true", WarmRestartMaxAgeKey: "10"}, false, 0, true},
	} {
		on, age, err := ParseWarmRestart(c.ann)
		if on != c.on || age != c.age || (err != nil) != c.fail {
			t.Errorf("%v: %v %s %v", c.ann, on, age, err)
		}
	}
}

func FuzzParseWarmRestart(f *testing.F) {
	f.Add("true", "1h")
	f.Add("false", "")
	f.Add("yes", "-5m")
	f.Add(strings.Repeat("x", 200), "9999999999h")
	f.Fuzz(func(t *testing.T, on, age string) {
		ok, d, err := ParseWarmRestart(map[string]string{WarmRestartKey: on, WarmRestartMaxAgeKey: age})
		if err != nil {
			if ok || d != 0 || len(err.Error()) > 300 {
				t.Fatalf("error %v with %v %s", err, ok, d)
			}
			return
		}
		if ok && (d < time.Second || d > MaxWarmRestartMaxAge) {
			t.Fatalf("age %s out of range", d)
		}
	})
}
