package backoff

import (
	"context"
	"strings"
	"testing"
	"time"
)

const s = time.Second

// Every row of KEP-4603's conflict-resolution table. The KEP's gates map to the
// shim's config: ReduceDefaultCrashLoopBackoffDecay off/on = initial 10 s with
// default max 300 s / initial 1 s with default max 60 s; the per-node maximum
// (EnableKubeletCrashLoopBackoffMax) = max_container_restart_period.
func TestResolveKEPTable(t *testing.T) {
	for _, tc := range []struct {
		scenario                     string
		initial, defaultMax, nodeMax time.Duration
		wantInitial, wantMax         time.Duration
		wantErr                      string
	}{
		{"today's behaviour", 10 * s, 300 * s, 0, 10 * s, 300 * s, ""},
		{"new default only", 1 * s, 60 * s, 0, 1 * s, 60 * s, ""},
		{"faster per node config", 10 * s, 300 * s, 60 * s, 10 * s, 60 * s, ""},
		{"faster per node config, max below initial", 10 * s, 300 * s, 2 * s, 2 * s, 2 * s, ""},
		{"faster per node config, new default", 1 * s, 60 * s, 2 * s, 1 * s, 2 * s, ""},
		{"faster per node config, 30s", 1 * s, 60 * s, 30 * s, 1 * s, 30 * s, ""},
		{"slower per node config, 300s", 1 * s, 60 * s, 300 * s, 1 * s, 300 * s, ""},
		{"slower per node config, 61s", 1 * s, 60 * s, 61 * s, 1 * s, 61 * s, ""},
		{"valid node config reimplementing today", 10 * s, 300 * s, 300 * s, 10 * s, 300 * s, ""},
		{"invalid per node config, old default", 10 * s, 300 * s, 301 * s, 0, 0, "between 1s and 5m0s"},
		{"invalid per node config, new default", 1 * s, 60 * s, 301 * s, 0, 0, "between 1s and 5m0s"},
		{"node max below 1s", 1 * s, 60 * s, 500 * time.Millisecond, 0, 0, "between 1s and 5m0s"},
		{"zero initial", 0, 60 * s, 0, 0, 0, "initial delay must be positive"},
		{"max below initial", 10 * s, 5 * s, 0, 0, 0, "below the initial delay"},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			c, err := Resolve(tc.initial, tc.defaultMax, tc.nodeMax)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error %q, got %v (%+v)", tc.wantErr, err, c)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Initial != tc.wantInitial || c.Max != tc.wantMax {
				t.Fatalf("got %s/%s, want %s/%s", c.Initial, c.Max, tc.wantInitial, tc.wantMax)
			}
		})
	}
}

func TestDelaySequences(t *testing.T) {
	seq := func(c Curve, n int) []time.Duration {
		var out []time.Duration
		for i := 1; i <= n; i++ {
			out = append(out, c.Delay(i))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		curve Curve
		want  []time.Duration
	}{
		// Acceptance 1 of the backoff issue: 1, 2, 4, 8, 16, 32, then 60.
		{"defaults", Curve{1 * s, 60 * s}, []time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 60 * s, 60 * s}},
		// Acceptance 2: node max 4 s gives 1, 2, 4, 4, 4; initial 10 s with node max 2 s gives 2, 2, 2.
		{"node max 4", mustResolve(t, 1*s, 60*s, 4*s), []time.Duration{1 * s, 2 * s, 4 * s, 4 * s, 4 * s}},
		{"initial 10 node max 2", mustResolve(t, 10*s, 300*s, 2*s), []time.Duration{2 * s, 2 * s, 2 * s}},
		{"today", Curve{10 * s, 300 * s}, []time.Duration{10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s}},
	} {
		got := seq(tc.curve, len(tc.want))
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: delays %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
	// No overflow far along the curve.
	if d := (Curve{1 * s, 60 * s}).Delay(10000); d != 60*s {
		t.Fatalf("restart 10000: %s", d)
	}
}

func mustResolve(t *testing.T, i, m, n time.Duration) Curve {
	t.Helper()
	c, err := Resolve(i, m, n)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type fakeClock struct{ now time.Time }

func (f *fakeClock) Now() time.Time { return f.now }

func TestTrackerNoFreeFirstRestartAndReset(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	tr := NewTracker(Curve{1 * s, 60 * s}, clk)
	k := Key{PodUID: "u", Container: "main"}

	// First exit: the restart waits the initial delay (no free first restart, k/k#123602).
	st := tr.Exited(k, "sb", clk.now.Add(-2*s), clk.now)
	if st.Restarts != 1 || st.LastDelay != 1*s || !st.NotBefore.Equal(clk.now.Add(1*s)) {
		t.Fatalf("first exit: %+v", st)
	}
	if r := tr.Remaining(k); r != 1*s {
		t.Fatalf("remaining right after exit: %s", r)
	}
	clk.now = clk.now.Add(1500 * time.Millisecond)
	if r := tr.Remaining(k); r != 0 {
		t.Fatalf("remaining after the delay: %s", r)
	}
	// Short runs climb the curve.
	for i, want := range []time.Duration{2 * s, 4 * s, 8 * s} {
		started := clk.now
		clk.now = clk.now.Add(5 * s)
		if st := tr.Exited(k, "sb", started, clk.now); st.LastDelay != want {
			t.Fatalf("exit %d: delay %s, want %s", i+2, st.LastDelay, want)
		}
	}
	// A run just under 10 minutes does not reset ...
	started := clk.now
	clk.now = clk.now.Add(ResetAfter - time.Millisecond)
	if st := tr.Exited(k, "sb", started, clk.now); st.LastDelay != 16*s {
		t.Fatalf("9m59.999s run: delay %s, want 16s", st.LastDelay)
	}
	// ... a run of 10 minutes does.
	started = clk.now
	clk.now = clk.now.Add(ResetAfter)
	if st := tr.Exited(k, "sb", started, clk.now); st.LastDelay != 1*s || st.Restarts != 1 {
		t.Fatalf("10m run: %+v, want the curve reset to 1s", st)
	}
	// Keys are independent; Forget drops a pod's keys.
	pod := Key{PodUID: "u"}
	if st := tr.Exited(pod, "sb", clk.now, clk.now); st.LastDelay != 1*s {
		t.Fatalf("pod key shares state with the container key: %+v", st)
	}
	tr.Forget("u", "sb")
	if _, _, ok := tr.Get(k); ok {
		t.Fatal("Forget kept a key")
	}
	tr.Restore(k, "sb", State{Restarts: 3, LastDelay: 4 * s, NotBefore: clk.now.Add(time.Second)})
	if st := tr.Exited(k, "sb", clk.now, clk.now); st.LastDelay != 8*s {
		t.Fatalf("restored state not continued: %+v", st)
	}
}

// Removing an old sandbox of a pod forgets only the keys that sandbox owns:
// the curve the pod's live sandbox restarts under stays where it is.
func TestForgetOnlyWhatTheSandboxOwns(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	tr := NewTracker(Curve{1 * s, 60 * s}, clk)
	pod, main, side := Key{PodUID: "u"}, Key{PodUID: "u", Container: "main"}, Key{PodUID: "u", Container: "side"}
	tr.Exited(pod, "old", clk.now, clk.now)
	tr.Exited(side, "old", clk.now, clk.now)
	// The pod's new sandbox continues the pod's curve and takes the key over.
	if st := tr.Exited(pod, "new", clk.now, clk.now); st.LastDelay != 2*s {
		t.Fatalf("new sandbox: %+v, want the pod's curve continued (2s)", st)
	}
	tr.Exited(main, "new", clk.now, clk.now)
	tr.Forget("u", "old")
	if st, owner, ok := tr.Get(pod); !ok || owner != "new" || st.Restarts != 2 {
		t.Fatalf("live sandbox's pod key after removing the old sandbox: %+v %q %v", st, owner, ok)
	}
	if _, _, ok := tr.Get(main); !ok {
		t.Fatal("live sandbox's container key forgotten")
	}
	if _, _, ok := tr.Get(side); ok {
		t.Fatal("old sandbox's own key kept")
	}
	if st := tr.Exited(pod, "new", clk.now, clk.now); st.LastDelay != 4*s {
		t.Fatalf("next restart of the live sandbox: %+v, want 4s", st)
	}
	tr.Forget("u", "new")
	if _, _, ok := tr.Get(pod); ok {
		t.Fatal("Forget of the owner kept its key")
	}
}

// Remaining is how long key must still wait (0 if it may restart now).
func (t *Tracker) Remaining(k Key) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e == nil {
		return 0
	}
	if d := e.NotBefore.Sub(t.clock.Now()); d > 0 {
		return d
	}
	return 0
}

// Sleep ends at its duration with ctx live, and at once, reporting it, when
// ctx is done.
func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("a sleep with a live context reported it done")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if Sleep(ctx, time.Hour) || time.Since(start) > time.Second {
		t.Fatal("a sleep with a done context did not end at once, reporting it")
	}
}
