package podstate

// The restart trace: with the log at debug level, every step of an in-place
// restart is logged with the time since the triggering exit, from the exit
// seen to the swap, and so are the kubelet's calls on the pod that pass
// through the shim meanwhile (its reads, creates, starts, stops and
// removals), up to traceTail after the swap. docs/in-place-restart.md,
// "Where the time goes", is read from it. At info level nothing is kept and
// each trace point costs one field read.

import (
	"context"
	"log/slog"
	"time"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// traceTail is how long after its swap a restart's trace still logs the
// kubelet's calls on the pod: long enough for its relist to notice the new
// instances (1 s) and read them.
const traceTail = 5 * time.Second

// restartTrace is one restart's clock. seen is when the shim classified the
// exit (m.clock, monotonic with the real clock); lag is how long after the
// container's own FinishedAt (the runtime's wall clock) that was, so
// seen+lag measures from the exit itself.
type restartTrace struct {
	pod  string
	seen time.Time
	lag  time.Duration
	// end is set at the swap (or when the restart is abandoned): the trace
	// is dropped traceTail after it.
	end time.Time
}

// Trace steps, as the debug log names them ("step").
const (
	traceExitSeen   = "exit seen"
	traceMatched    = "rule matched"
	traceStep       = "step"
	traceRefined    = "shown set checked"
	traceStopAsked  = "stop asked"
	traceStopped    = "stopped"
	traceWait       = "wait"
	traceCreate     = "create asked"
	traceCreated    = "created"
	traceStarted    = "started"
	traceUp         = "running"
	traceExited     = "exited"
	traceSwapped    = "swapped"
	traceKubelet    = "kubelet "
	traceKubeRead   = traceKubelet + "read"
	traceKubeRemove = traceKubelet + "remove"
	traceKubeCreate = traceKubelet + "create"
	traceKubeStart  = traceKubelet + "start"
	traceKubeStop   = traceKubelet + "stop"
)

// debugEnabled reports whether log has debug level on (the trace's switch,
// read once: the level is fixed for the process).
func debugEnabled(log *slog.Logger) bool {
	return log != nil && log.Enabled(context.Background(), slog.LevelDebug)
}

// traceBegin starts the trace of a restart of p whose triggering exit
// finished at finished, replacing any earlier one. m.mu held.
func (m *Manager) traceBegin(p *restartrecord.Pod, finished time.Time, via string) {
	if !m.debug {
		return
	}
	now := m.clock.Now()
	t := &restartTrace{pod: p.Namespace + "/" + p.Name, seen: now, lag: now.Sub(finished)}
	m.traces.Store(p.SandboxID, t)
	m.emit(p.SandboxID, t, now, traceExitSeen, "via", via)
}

// trace logs one step of the sandbox's restart in progress (or of the
// kubelet's calls up to traceTail after its swap); nothing without a trace.
func (m *Manager) trace(sandboxID, step string, args ...any) {
	if !m.debug {
		return
	}
	if _, t, now := m.traceOf(sandboxID); t != nil {
		m.emit(sandboxID, t, now, step, args...)
	}
}

// traceOf is the sandbox's trace (as stored, and as a *restartTrace) and
// the time now; nil when it has none, or its tail is over (then dropped).
func (m *Manager) traceOf(sandboxID string) (any, *restartTrace, time.Time) {
	v, ok := m.traces.Load(sandboxID)
	if !ok {
		return nil, nil, time.Time{}
	}
	t, now := v.(*restartTrace), m.clock.Now()
	if !t.end.IsZero() && now.Sub(t.end) > traceTail {
		m.traces.CompareAndDelete(sandboxID, v)
		return nil, nil, now
	}
	return v, t, now
}

// traceContainer is trace for the sandbox of a tracked container instance.
func (m *Manager) traceContainer(id, step string, args ...any) {
	if !m.debug {
		return
	}
	sb := ""
	m.withContainer(id, func(p *restartrecord.Pod, _ *restartrecord.Instance) {
		if p != nil {
			sb = p.SandboxID
		}
	})
	if sb != "" {
		m.trace(sb, step, append(args, "container", id)...)
	}
}

// traceEnd logs the restart's last step and starts its tail.
func (m *Manager) traceEnd(sandboxID, step string, args ...any) {
	if !m.debug {
		return
	}
	v, t, now := m.traceOf(sandboxID)
	if t == nil {
		return
	}
	m.emit(sandboxID, t, now, step, args...)
	// A new trace (the next restart) is left alone.
	m.traces.CompareAndSwap(sandboxID, v, &restartTrace{pod: t.pod, seen: t.seen, lag: t.lag, end: now})
}

func (m *Manager) emit(sandboxID string, t *restartTrace, now time.Time, step string, args ...any) {
	since := t.lag + now.Sub(t.seen)
	m.log.Debug("podstate: restart trace", append([]any{"pod", t.pod, "sandbox", sandboxID, "step", step,
		"sinceExitMs", float64(since.Microseconds()) / 1000}, args...)...)
}
