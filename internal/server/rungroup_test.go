package server

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A runnable is stopped only after every runnable that uses it has
// returned, whether ctx ended or stop was called, and whichever of the two
// was added first; a use of a name not added, or a cycle of uses, is
// refused before anything starts.
func TestRunGroupStopsUsersFirst(t *testing.T) {
	var mu sync.Mutex
	var stopped []string
	var started sync.WaitGroup // each runnable has begun
	var endedAtStart atomic.Int32
	record := func(name string, linger time.Duration) func(context.Context) {
		started.Add(1)
		return func(ctx context.Context) {
			if ctx.Err() != nil {
				endedAtStart.Add(1)
			}
			started.Done()
			<-ctx.Done()
			time.Sleep(linger) // a runnable finishing its last work
			mu.Lock()
			stopped = append(stopped, name)
			mu.Unlock()
		}
	}
	var g runGroup
	g.Add("writer", record("writer", 0))
	g.Add("feed", record("feed", 0))
	g.Add("reporter", record("reporter", 20*time.Millisecond), "writer")
	g.Add("restarts", record("restarts", 40*time.Millisecond), "feed", "reporter")
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := g.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	started.Wait()
	mu.Lock()
	early := len(stopped)
	mu.Unlock()
	if early != 0 || endedAtStart.Load() != 0 {
		t.Fatalf("%d runnables stopped, %d given an ended context, before ctx ended or stop was called", early, endedAtStart.Load())
	}
	cancel() // the server's context ends: the stop begins
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(stopped)
		mu.Unlock()
		if n == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d runnables stopped after ctx ended", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	stop()
	pos := func(name string) int { return slices.Index(stopped, name) }
	if pos("restarts") > pos("reporter") || pos("reporter") > pos("writer") || pos("restarts") > pos("feed") {
		t.Fatalf("stop order %v: a runnable stopped before one that uses it", stopped)
	}

	// stop called first does the same.
	stopped = nil
	var h runGroup
	h.Add("writer", record("writer", 0))
	h.Add("reporter", record("reporter", 20*time.Millisecond), "writer")
	stop, err = h.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !slices.Equal(stopped, []string{"reporter", "writer"}) {
		t.Fatalf("stop order %v", stopped)
	}

	// A use of a runnable added later is the same.
	stopped = nil
	var later runGroup
	later.Add("reporter", record("reporter", 20*time.Millisecond), "writer")
	later.Add("writer", record("writer", 0))
	if stop, err = later.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stop()
	if !slices.Equal(stopped, []string{"reporter", "writer"}) {
		t.Fatalf("stop order %v", stopped)
	}

	for name, add := range map[string]func(*runGroup){
		"a use of a runnable not added": func(g *runGroup) { g.Add("reporter", record("x", 0), "writer") },
		"a cycle of uses": func(g *runGroup) {
			g.Add("a", record("a", 0), "c")
			g.Add("b", record("b", 0), "a")
			g.Add("c", record("c", 0), "b")
			g.Add("d", record("d", 0))
		},
	} {
		var bad runGroup
		add(&bad)
		if _, err := bad.Start(context.Background()); err == nil {
			t.Fatalf("%s was accepted", name)
		}
	}
}
