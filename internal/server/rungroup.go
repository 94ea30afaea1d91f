package server

import (
	"context"
	"sync"
)

// runGroup is what runs beside the CRI server: each runnable is started
// with the group, under a context the group cancels when it stops, and the
// group's stop waits for all of them to return.
type runGroup struct {
	runs []namedRun
}

type namedRun struct {
	name string
	run  func(context.Context)
}

// Add adds run, named for what it does.
func (g *runGroup) Add(name string, run func(context.Context)) {
	g.runs = append(g.runs, namedRun{name, run})
}

// Start starts every runnable and returns the group's stop, which cancels
// their context and waits for them; calling it again does nothing.
func (g *runGroup) Start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range g.runs {
		wg.Add(1)
		go func() { defer wg.Done(); r.run(ctx) }()
	}
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}
