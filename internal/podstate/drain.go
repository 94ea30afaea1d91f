package podstate

// Ending Run without cutting a runtime call short.

import (
	"errors"
	"sync"
	"time"
)

// drainTimeout bounds how long Run's end waits for executors to finish the
// runtime call they are in before those calls are cancelled too.
const drainTimeout = 5 * time.Second

// errStopping ends an executor's step at a wait or between steps when Run
// ends; the pod's recorded phase is where the next process resumes.
var errStopping = errors.New("podstate: shim stopping")

// drain ends Run: executors stop at their next wait or step, but the runtime
// call each is in finishes first. A call cut short leaves the runtime midway
// (a StartContainer cancelled in containerd leaves the container "already in
// starting state", so the next process's start fails until containerd's own
// ends), which an in-place upgrade would otherwise do to every pod
// restarting at that moment. After drainTimeout the calls are cancelled.
func (m *Manager) drain(wg *sync.WaitGroup) {
	m.quitOnce.Do(func() { close(m.quit) })
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	m.mu.Lock()
	for _, cancel := range m.active {
		cancel()
	}
	m.mu.Unlock()
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
