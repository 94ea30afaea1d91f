package podstate

// Sandbox calls: a pod with restart rules is tracked from its RunPodSandbox;
// its restart is abandoned when the kubelet stops it and forgotten when it is
// removed.

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

func (m *Manager) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	cfg := req.GetConfig()
	spec := podspec.Parse(cfg.GetAnnotations())
	rules, term := spec.Rules, spec.Termination
	var problems []string
	for _, p := range spec.Problems {
		if p.Feature == podspec.FeatureRestart {
			problems = append(problems, p.Message)
		}
	}
	md := cfg.GetMetadata()
	for _, pr := range problems {
		m.metrics.problems.Inc()
		m.log.Warn("podstate: "+pr, "pod", md.GetNamespace()+"/"+md.GetName())
	}
	if len(rules) == 0 && (m.trackAlso == nil || !m.trackAlso(cfg.GetAnnotations())) {
		if len(problems) > 0 {
			if err := m.st.saveProblems(&Pod{SandboxID: resp.PodSandboxId, UID: md.GetUid(), Name: md.GetName(),
				Namespace: md.GetNamespace(), Problems: problems, Phase: PhaseRunning}); err != nil {
				m.log.Error("podstate: recording annotation problems", "err", err)
			}
		}
		return resp, nil
	}
	p := &Pod{
		SandboxID: resp.PodSandboxId, UID: md.GetUid(), Name: md.GetName(), Namespace: md.GetNamespace(),
		LogDirectory: cfg.GetLogDirectory(), Rules: rules, Problems: problems, Termination: term, Phase: PhaseRunning,
		PhaseSince: m.clock.Now(),
	}
	m.mu.Lock()
	m.adopt(p)
	err = m.save(p)
	if err != nil {
		delete(m.pods, p.SandboxID)
		m.reads.Delete(p.SandboxID)
		m.tracked.Store(int32(len(m.pods)))
	}
	m.mu.Unlock()
	if err != nil {
		// A pod whose rules could not be recorded would run without them
		// after a restart of the shim: its sandbox is taken down again and
		// the kubelet retries.
		m.rollbackSandbox(ctx, resp.PodSandboxId)
		return nil, unavailable(err)
	}
	m.log.Info("podstate: pod has restart rules", "pod", p.Namespace+"/"+p.Name, "sandbox", p.SandboxID, "containers", len(rules))
	return resp, nil
}

// stopPodSandbox: the kubelet is stopping the pod (deleted, or terminal); a
// restart in progress is abandoned, the pod is shown as it really is, and no
// rule restarts anything in it any more.
func (m *Manager) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	m.mu.Lock()
	if p := m.pods[req.PodSandboxId]; p != nil && !p.Stopped {
		phase := p.Phase
		if err := m.abandon(p); err != nil {
			m.mu.Unlock()
			return nil, unavailable(err)
		}
		if phase != PhaseRunning {
			m.log.Info("podstate: pod is being stopped; restart abandoned", "pod", p.Namespace+"/"+p.Name, "phase", phase)
		}
	}
	m.mu.Unlock()
	return next(ctx, req)
}

// SandboxGone forgets a sandbox the pod table announced gone (removed, or
// no longer listed by the runtime): the server subscribes it to the store's
// lifecycle, which removes the pod's records right after; save skips pods no
// longer tracked, so none is written again.
func (m *Manager) SandboxGone(id string) {
	m.mu.Lock()
	if p := m.dropLocked(id); p != nil {
		// Its slots now, so that the slot writer forgets their sequence
		// too (the store removes the files again, finding none).
		if err := m.st.remove(id); err != nil {
			m.log.Warn("podstate: removing the state of a sandbox that is gone", "sandbox", id, "err", err)
		}
		m.log.Info("podstate: sandbox gone; state dropped", "pod", p.Namespace+"/"+p.Name, "sandbox", id)
	}
	m.mu.Unlock()
}

// dropLocked forgets a sandbox's pod, if tracked, and stops its executor;
// it returns the pod forgotten. The caller holds m.mu.
func (m *Manager) dropLocked(id string) *Pod {
	p := m.pods[id]
	if p == nil {
		return nil
	}
	for cid := range p.Instances {
		delete(m.byID, cid)
	}
	delete(m.pods, id)
	m.reads.Delete(id)
	m.stopExecutor(id)
	m.tracked.Store(int32(len(m.pods)))
	// Only the curve keys this sandbox owns: another (live) sandbox of the
	// same pod keeps its position (backoff.Tracker).
	m.bo.Forget(p.UID, id)
	return p
}

// rollbackSandbox stops and removes a sandbox this call created, under a
// fresh context (the caller's may be the reason it failed).
func (m *Manager) rollbackSandbox(ctx context.Context, id string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := m.rt.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		m.log.Error("podstate: stopping the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
	if _, err := m.rt.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		m.log.Error("podstate: removing the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
}
