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
// runtime than the kubelet keeps (KeepDead, its
// --maximum-dead-containers-per-container) plus backlogSlack: the one this
// restart replaces, and those of the restarts before it that the kubelet has
// not removed yet because it removes an instance only once it has seen a
// later one exit (after the hold of the replaced instance ends, and a
// relist): on an idle node with a 4 s cap it was still two restarts behind
// (the e2e backoff test). More than that is the kubelet falling behind.

import (
	"context"
	"time"
)

// maxBacklogWait (Manager.backlogWait) bounds the wait: a kubelet that keeps more exited
// instances than configured, or removes none, slows restarts down to one a
// minute per pod instead of stopping them.
const maxBacklogWait = time.Minute

// backlogSlack is how many instances of a container beyond the kubelet's
// keep a restart tolerates: the one it replaces and three more. A kubelet
// falling behind piles up hundreds (bench/results/backoff-stress-20261124-184953-stopped.txt).
const backlogSlack = 4

// KeepDead sets how many exited instances of each container the kubelet
// keeps (its --maximum-dead-containers-per-container; 1 by default). Call
// before Run.
func (m *Manager) KeepDead(n int) {
	if n >= 1 {
		m.keepDead = n
	}
}

// backlog returns a container the restart in progress creates again that
// has more than keep+backlogSlack instances on record (every instance the runtime still
// has: removals are forgotten), and how many; "" when none has.
func backlog(p *Pod, keep int) (string, int) {
	counts := map[string]int{}
	for _, in := range p.Instances {
		if p.Scope == "" || in.Name == p.Scope {
			counts[in.Name]++
		}
	}
	for name, n := range counts {
		if n > keep+backlogSlack {
			return name, n
		}
	}
	return "", 0
}

// waitBacklog waits, in TerminatingForRestart, until no container the
// restart creates again has a backlog of exited instances, woken by each
// removal (forget) and phase change; at most maxBacklogWait.
func (m *Manager) waitBacklog(ctx context.Context, sandboxID string) error {
	var deadline time.Time
	for {
		m.mu.Lock()
		p := m.pods[sandboxID]
		if p == nil || p.Phase != PhaseTerminating {
			m.mu.Unlock()
			return nil
		}
		name, n := backlog(p, m.keepDead)
		changed := m.phaseWait()
		pod := p.Namespace + "/" + p.Name
		m.mu.Unlock()
		if name == "" {
			return nil
		}
		now := m.clock.Now()
		if deadline.IsZero() {
			deadline = now.Add(m.backlogWait)
			m.metrics.backlog.Inc()
			m.log.Info("podstate: restart waits for the kubelet to remove exited instances", "pod", pod, "container", name, "instances", n)
		}
		left := deadline.Sub(now)
		if left <= 0 {
			m.log.Warn("podstate: exited instances not removed in time; restarting anyway", "pod", pod, "container", name, "instances", n, "waited", m.backlogWait)
			return nil
		}
		if err := m.pause(ctx, left, changed); err != nil {
			return err
		}
	}
}
