package podstate

// The restart engine's loop. Sandboxes with a restart step to run are keys
// of a rate-limited work queue (client-go's, as a controller's objects
// are): the queue runs one step of a sandbox at a time, and a step that must
// wait (the backoff delay, the kubelet's removals: step) returns how long,
// so the sandbox is queued again after that and no goroutine sleeps through
// the wait. A failed step is queued again on backoff.RetryLimiter's curve.

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// A failed step is tried again after retryMin, doubling up to retryMax
// (jittered): a runtime that is down is asked about once every 10 s per
// restarting pod, not every second.
const (
	retryMin = time.Second
	retryMax = 10 * time.Second
)

// drainTimeout bounds how long Run's end waits for steps to finish the
// runtime call they are in before those calls are cancelled too.
const drainTimeout = 5 * time.Second

// errStopping ends a step at a wait or between runtime calls when Run
// ends; the pod's recorded phase is where the next process resumes.
var errStopping = errors.New("podstate: shim stopping")

func newQueue() workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(backoff.RetryLimiter(retryMin, retryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "podstate_restarts"})
}

// kick queues a sandbox's next restart step.
func (m *Manager) kick(sandboxID string) { m.queue.Add(sandboxID) }

// Run drives restarts until ctx ends: it resumes what was in progress and
// rescans, so nothing depends on a single event (OnEvent sees exits at once).
func (m *Manager) Run(ctx context.Context) {
	var steps sync.WaitGroup
	dispatched := make(chan struct{})
	defer m.drain(&steps, dispatched)
	m.reconcile(ctx)
	m.scan(ctx)
	m.mu.Lock()
	for id, p := range m.pods.All() {
		if p.Phase != restartrecord.PhaseRunning {
			m.kick(id)
		}
	}
	m.mu.Unlock()
	go func() { defer close(dispatched); m.dispatch(ctx, &steps) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	ticks := 0
	var lastLive uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if ticks++; ticks%10 == 0 {
				m.reconcile(ctx)
			}
			// While the event feed is subscribed, exits arrive through
			// OnEvent (and the kubelet's status calls): the scan is a
			// safety net every 10 s. Without a subscription, or after a new
			// one (events in between are lost), it runs at once.
			if live := m.opts.EventsLive(); live == 0 || live != lastLive || ticks%10 == 0 {
				m.scan(ctx)
				lastLive = live
			}
		}
	}
}

// dispatch runs each sandbox the queue hands out in a goroutine of its own
// (restarts of different pods overlap, as the kubelet's pod workers do),
// until the queue is shut down.
func (m *Manager) dispatch(ctx context.Context, steps *sync.WaitGroup) {
	for {
		id, shutdown := m.queue.Get()
		if shutdown {
			return
		}
		if m.stopping() {
			m.queue.Done(id)
			continue
		}
		steps.Add(1)
		go func() {
			defer steps.Done()
			defer m.queue.Done(id)
			m.process(ctx, id)
		}()
	}
}

// process runs a sandbox's next step and queues it again as the step's
// outcome asks: after its wait, on the retry curve after a failure, or not
// at all once the restart is over (or abandoned).
func (m *Manager) process(ctx context.Context, sandboxID string) {
	// Not cancelled when Run ends: drain lets the runtime call in progress
	// finish (cancelStep and drain's deadline cancel it).
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.running.Store(sandboxID, cancel)
	defer func() {
		m.running.Delete(sandboxID)
		cancel()
	}()
	after, err := m.step(sctx, sandboxID)
	switch {
	case err == nil:
		m.queue.Forget(sandboxID)
		if after > 0 {
			m.queue.AddAfter(sandboxID, after)
		}
	case sctx.Err() != nil || errors.Is(err, errStopping):
		// The pod is gone (cancelStep) or the shim stops: the next
		// process resumes from the recorded phase.
	case m.abandonIfSandboxGone(ctx, sandboxID, err):
		m.queue.Forget(sandboxID)
	default:
		m.queue.AddRateLimited(sandboxID)
		if m.noteError(sandboxID, err) {
			m.log.Error("podstate: restart step failed; retrying with backoff", "sandbox", sandboxID, "err", err)
		}
	}
}

// noteError records a step's error on its pod and reports whether it is a
// new one (logged once, not at every retry).
func (m *Manager) noteError(sandboxID string, err error) (isNew bool) {
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if isNew = p != nil && p.LastError != err.Error(); isNew {
			p.LastError = err.Error()
		}
	})
	return isNew
}

// cancelStep ends the sandbox's step in progress, if any, once its pod's
// restart is abandoned or its sandbox removed, so a step inside a long
// runtime call does not keep the pod's record alive.
func (m *Manager) cancelStep(sandboxID string) {
	if c, ok := m.running.Load(sandboxID); ok {
		c.(context.CancelFunc)()
	}
}

// drain ends Run: the queue hands out nothing more, and steps stop at their
// next wait or between runtime calls, but the call each is in finishes
// first. A call cut short leaves the runtime midway (a StartContainer
// cancelled in containerd leaves the container "already in starting
// state", so the next process's start fails until containerd's own ends),
// which an in-place upgrade would otherwise do to every pod restarting at
// that moment. After drainTimeout the calls are cancelled.
func (m *Manager) drain(steps *sync.WaitGroup, dispatched <-chan struct{}) {
	m.quitOnce.Do(func() { close(m.quit) })
	m.queue.ShutDown()
	<-dispatched
	done := make(chan struct{})
	go func() { steps.Wait(); close(done) }()
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	m.running.Range(func(_, c any) bool {
		c.(context.CancelFunc)()
		return true
	})
	<-done
}

// stopping reports whether Run has ended.
func (m *Manager) stopping() bool {
	select {
	case <-m.quit:
		return true
	default:
		return false
	}
}
