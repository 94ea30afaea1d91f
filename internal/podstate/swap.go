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
	m.with(sandboxID, func(p *restartrecord.Pod) { err = m.swapLocked(p, exited, handBack) })
	return err
}

// swapLocked is swap of p (nil: no longer tracked) with m.mu held.
func (m *Manager) swapLocked(p *restartrecord.Pod, exited []*runtimeapi.ContainerStatus, handBack bool) error {
	if p == nil || p.Phase != restartrecord.PhaseStartup {
		for _, s := range exited {
			if _, err := m.classifyLocked(s); err != nil {
				return err
			}
		}
		return nil
	}
	c := m.pods.Begin(p)
	took, trigger := m.clock.Now().Sub(p.Trigger.FinishedAt), *p.Trigger
	if err := m.enter(p, restartrecord.EventSwapped); err != nil {
		return c.Commit(err)
	}
	p.Swap(handBack, m.clock.Now().Add(maxHold))
	var err error
	for _, s := range exited {
		if _, err = m.classifyLocked(s); err != nil {
			break
		}
	}
	if !c.Saved() { // else a classification's save carried the swap
		if err := c.Commit(err); err != nil {
			return err
		}
	}
	// Recorded (an exit whose verdict could not be recorded is classified
	// at the next look).
	m.metrics.latency.Observe(took.Seconds())
	if p.Phase == restartrecord.PhaseRunning {
		m.opts.Observer.RestartEnded(refOf(p), trigger, restartapi.Restarted)
	} else {
		m.opts.Observer.RestartEnded(refOf(p), trigger, restartapi.RestartedAgain)
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
