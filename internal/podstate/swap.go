package podstate

// The swap: the new instances shown at once, the old ones gone.

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// swap ends a restart: the new instances become visible and the old ones show
// their real (exited) state, as the previous instance of each container.
// A new instance that already exited again (a container that crashes at
// once) is classified in the same locked step, so the kubelet never sees its
// exit unclassified between the swap and the next scan. A swap that cannot be
// recorded is not made: the replay is retried and swaps again.
//
// handBack: an init container failed and the replay stopped there; the old
// instances of the containers it did not reach are hidden from the kubelet
// (Instance.Hidden), so that it sees the pod as upstream leaves it after a
// reset, not initialized, and retries the init container (restartPolicy
// Always, OnFailure) or fails the pod (Never) itself.
func (m *Manager) swap(sandboxID string, exited []*runtimeapi.ContainerStatus, handBack bool) (err error) {
	m.with(sandboxID, func(p *Pod) { err = m.swapLocked(p, exited, handBack) })
	return err
}

// swapLocked is swap of p (nil: no longer tracked) with m.mu held.
func (m *Manager) swapLocked(p *Pod, exited []*runtimeapi.ContainerStatus, handBack bool) error {
	if p == nil || p.Phase != PhaseStartup {
		for _, s := range exited {
			if _, err := m.classifyLocked(s); err != nil {
				return err
			}
		}
		return nil
	}
	snap, saves := p.Snapshot(), m.saves
	replaced := map[string]string{} // container name: the instance this swap replaces
	for id, name := range p.PartOf(PartNew) {
		replaced[name] = p.Latest[name]
		p.Latest[name] = id
	}
	// A container started again shows its older instances as they are; a
	// whole-pod restart handed back hides those of the containers it did not
	// start again until the kubelet creates them (recordCreate).
	for _, in := range p.Instances {
		if _, renewed := replaced[in.Name]; renewed {
			in.Hidden = false
		} else if handBack && p.Scope == "" {
			in.Hidden = true
		}
	}
	if p.Scope != "" {
		if p.ContainerRestarts == nil {
			p.ContainerRestarts = map[string]int{}
		}
		p.ContainerRestarts[p.Scope]++
	} else {
		p.Restarts++
	}
	p.Scope = ""
	took, trigger := m.clock.Now().Sub(p.Trigger.FinishedAt), *p.Trigger
	if err := m.enter(p, restartrecord.EventSwapped); err != nil {
		m.rollback(p, snap)
		return err
	}
	// Hold the instance this swap replaces if a list showed it running (see
	// Instance.HeldUntil). Older instances of the container keep the hold
	// their own swap gave them: renewing it at every swap would, in a crash
	// loop (one kubelet read per swap), keep every replaced instance shown
	// running, so the kubelet would never see one exit and never remove it.
	for id, in := range p.Instances {
		prev, ok := replaced[in.Name]
		if !in.Listed || in.Part == PartNew || !ok {
			continue
		}
		if id == prev {
			in.HeldUntil, in.HeldAt = m.clock.Now().Add(maxHold), p.Reads.N.Load()
		}
		in.Listed = false
	}
	p.EndRestartParts()
	p.LastError, p.Creating, p.WarmFailed = "", "", nil
	var err error
	for _, s := range exited {
		if _, err = m.classifyLocked(s); err != nil {
			break
		}
	}
	if err == nil && m.saves == saves {
		err = m.save(p) // one save for the swap and what it classified
	}
	if err != nil && m.saves == saves {
		m.rollback(p, snap)
		return err
	}
	// Recorded (a classification's save carried the swap; an exit whose
	// verdict could not be recorded is classified at the next look).
	m.metrics.latency.Observe(took.Seconds())
	if p.Phase == PhaseRunning {
		m.observer.RestartEnded(refOf(p), trigger, restartapi.Restarted)
	} else {
		m.observer.RestartEnded(refOf(p), trigger, restartapi.RestartedAgain)
	}
	m.traceEnd(p.SandboxID, traceSwapped, "restarts", p.Restarts)
	m.log.Info("podstate: pod restarted in place", "pod", p.Namespace+"/"+p.Name, "restarts", p.Restarts, "sinceExit", took.Round(time.Millisecond))
	return nil
}

var logFileRe = regexp.MustCompile(`^(\d+)\.log`)

// nextRestartCount is one more than both the recorded request's count and the
// highest N.log in the container's log directory, as the kubelet computes it
// when a container has no status left (calcRestartCountByLogDir).
func nextRestartCount(req *runtimeapi.CreateContainerRequest, logDir string) int {
	n := int(req.GetConfig().GetMetadata().GetAttempt()) + 1
	if v, err := strconv.Atoi(req.GetConfig().GetAnnotations()[annotationRestartCount]); err == nil && v+1 > n {
		n = v + 1
	}
	if logDir != "" {
		entries, _ := os.ReadDir(filepath.Join(logDir, req.GetConfig().GetMetadata().GetName()))
		for _, e := range entries {
			if mm := logFileRe.FindStringSubmatch(e.Name()); mm != nil {
				if v, err := strconv.Atoi(mm[1]); err == nil && v+1 > n {
					n = v + 1
				}
			}
		}
	}
	return n
}
