package podstate

// A restart waits for the kubelet's container removal to keep up.
//
// Every in-place restart leaves the replaced instances exited in the
// runtime; the kubelet removes them (pkg/kubelet/pod_container_deletor.go:
// on each ContainerDied event it queues every exited instance of that
// container but the newest for one worker goroutine, through a 50-entry
// queue that drops what does not fit). A pod restarting at a 1 s cap creates
// instances faster than that worker removes them under load; the pile grows,
// every relist walks it, and once one relist takes over 3 minutes the
// kubelet reports "PLEG is not healthy" and stops syncing pods
// (bench/results/backoff-stress-20261124-184953-stopped.txt, docs/backoff.md).
// So before a restart creates new instances it waits, at most
// maxBacklogWait, while a container it restarts has more instances in the
// runtime than the kubelet keeps (Options.KeepDead, its
// --maximum-dead-containers-per-container) plus backlogSlack: the one this
// restart replaces, and those of the restarts before it that the kubelet has
// not removed yet because it removes an instance only once it has seen a
// later one exit (after the hold of the replaced instance ends, and a
// relist): on an idle node with a 4 s cap it was still two restarts behind
// (the e2e backoff test). More than that is the kubelet falling behind.

import (
	"time"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// maxBacklogWait (Manager.backlogWait) bounds the wait: a kubelet that keeps more exited
// instances than configured, or removes none, slows restarts down to one a
// minute per pod instead of stopping them.
const maxBacklogWait = time.Minute

// backlogDelay is how long a restart in TerminatingForRestart still waits
// for the kubelet's removals: 0 once no container it creates again has a
// backlog of exited instances, or once it has waited maxBacklogWait. The
// wait begins at the first look that finds a backlog; each removal queues
// the sandbox's step again (forget), so the restart goes on at once.
func (m *Manager) backlogDelay(sandboxID string) (wait time.Duration) {
	m.with(sandboxID, func(p *restartrecord.Pod) { wait = m.backlogLeft(p) })
	return wait
}

// backlogLeft is backlogDelay of p, with m.mu held.
func (m *Manager) backlogLeft(p *restartrecord.Pod) time.Duration {
	if p == nil || p.Phase != restartrecord.PhaseTerminating || p.Backlog.Over {
		return 0
	}
	name, n := p.Backlogged(m.opts.KeepDead)
	if name == "" {
		return 0
	}
	now, pod := m.clock.Now(), p.Namespace+"/"+p.Name
	if p.Backlog.Until.IsZero() {
		p.Backlog.Until = now.Add(m.backlogWait)
		m.metrics.backlog.Inc()
		m.log.Info("podstate: restart waits for the kubelet to remove exited instances", "pod", pod, "container", name, "instances", n)
	}
	left := p.Backlog.Until.Sub(now)
	if left <= 0 {
		p.Backlog.Over = true
		m.log.Warn("podstate: exited instances not removed in time; restarting anyway", "pod", pod, "container", name, "instances", n, "waited", m.backlogWait)
		return 0
	}
	return left
}
