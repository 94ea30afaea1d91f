package server

import (
	"context"
	"fmt"
	"sync"
)

// runGroup is what runs beside the CRI server, as controller-runtime's
// Manager.Add or containerd's plugin registration: each runnable is added
// with the runnables it uses while it runs. The group starts a runnable
// after those and stops it before them: a feature that queues API writes
// stops before the writer, which then makes what was queued; the
// PodCheckpoint controller stops before the resume retries that undo a
// capture it cancelled. Runnables with nothing between them start and stop
// side by side.
type runGroup struct {
	runs []*runnable
}

type runnable struct {
	name   string
	run    func(context.Context)
	uses   []string
	users  []*runnable // runnables that use this one
	cancel context.CancelFunc
	done   chan struct{}
}

// Add adds run, named for what it does, which uses the runnables named in
// uses (added before or after it) while it runs.
func (g *runGroup) Add(name string, run func(context.Context), uses ...string) {
	g.runs = append(g.runs, &runnable{name: name, run: run, uses: uses})
}

// Start starts every runnable, each after those it uses, and returns the
// group's stop. The stop begins when ctx ends or stop is called, whichever
// comes first: it cancels each runnable once every runnable that uses it has
// returned, and stop waits for all of them; calling it again does nothing
// more. A name used but not added, or uses that form a cycle (each
// runnable would wait for the other to stop), are an error, and nothing
// starts.
func (g *runGroup) Start(ctx context.Context) (stop func(), err error) {
	byName := map[string]*runnable{}
	for _, r := range g.runs {
		if byName[r.name] != nil {
			return nil, fmt.Errorf("runnable %q added twice", r.name)
		}
		byName[r.name] = r
	}
	for _, r := range g.runs {
		for _, u := range r.uses {
			dep := byName[u]
			if dep == nil {
				return nil, fmt.Errorf("runnable %q uses %q, which is not added", r.name, u)
			}
			dep.users = append(dep.users, r)
		}
	}
	// depth is how many runnables use one in a chain: fewer than all of
	// them, unless the chain has a cycle (each pass lengthens it by one).
	depth := map[*runnable]int{}
	for range g.runs {
		for _, r := range g.runs {
			for _, u := range r.users {
				if depth[r] = max(depth[r], depth[u]+1); depth[r] >= len(g.runs) {
					return nil, fmt.Errorf("the uses of runnable %q form a cycle", r.name)
				}
			}
		}
	}
	base := context.WithoutCancel(ctx)
	for _, r := range g.runs {
		var rctx context.Context
		rctx, r.cancel = context.WithCancel(base)
		r.done = make(chan struct{})
		go func() { defer close(r.done); r.run(rctx) }()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			for _, r := range g.runs {
				go func() {
					for _, u := range r.users {
						<-u.done
					}
					r.cancel()
				}()
			}
			for _, r := range g.runs {
				<-r.done
			}
		})
	}
	// The server's context ends at SIGTERM or an upgrade: the features stop
	// then, side by side with the CRI server's graceful stop, not after it
	// (a restart begun during the stop would be cut short by the exec).
	context.AfterFunc(ctx, stop)
	return stop, nil
}
