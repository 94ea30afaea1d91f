package podstate

// Sandbox calls: a pod with restart rules is tracked from its RunPodSandbox;
// its restart is abandoned when the kubelet stops it and forgotten when it is
// removed.

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

var _ podtable.Admitter = (*Manager)(nil)

// Admit takes a new pod's restart rules (podspec): once its sandbox exists,
// a pod with rules, or one TrackAlso asks for, is tracked and its record
// written; a pod whose rules could not be used at all gets a problems-only
// record for `cri-shim pods`. A record that cannot be written fails the
// commit (Unavailable): the pod table removes the sandbox and the kubelet
// retries, since a pod whose rules were not recorded would run without them
// after a restart of the shim.
func (m *Manager) Admit(_ context.Context, pod *podtable.Pod) (podtable.Admission, error) {
	cfg, spec := pod.Request.GetConfig(), pod.Spec
	md := cfg.GetMetadata()
	var problems []string
	for _, p := range spec.Problems {
		if p.Feature == podspec.FeatureRestart {
			problems = append(problems, p.Message)
		}
	}
	tracked := len(spec.Rules) > 0 || (m.opts.TrackAlso != nil && m.opts.TrackAlso(spec))
	if !tracked && len(problems) == 0 {
		return podtable.Admission{}, nil
	}
	commit := func(_ context.Context, id string) error {
		for _, pr := range problems {
			m.metrics.problems.Inc()
			m.log.Warn("podstate: "+pr, "pod", md.GetNamespace()+"/"+md.GetName())
		}
		if !tracked {
			if err := m.st.SaveProblems(&restartrecord.Pod{SandboxID: id, UID: md.GetUid(), Name: md.GetName(),
				Namespace: md.GetNamespace(), Problems: problems, Phase: restartrecord.PhaseRunning}); err != nil {
				m.log.Error("podstate: recording annotation problems", "err", err)
			}
			return nil
		}
		p := &restartrecord.Pod{
			SandboxID: id, UID: md.GetUid(), Name: md.GetName(), Namespace: md.GetNamespace(),
			LogDirectory: cfg.GetLogDirectory(), Rules: spec.Rules, Problems: problems, Termination: spec.Termination,
			Phase: restartrecord.PhaseRunning, PhaseSince: m.clock.Now(),
		}
		var err error
		m.with(id, func(*restartrecord.Pod) {
			m.adopt(p)
			if err = m.pods.Save(p); err != nil {
				m.dropLocked(p.SandboxID) // it has no step, trace or curve yet
			}
		})
		if err != nil {
			return unavailable(err)
		}
		m.log.Info("podstate: pod has restart rules", "pod", p.Namespace+"/"+p.Name, "sandbox", p.SandboxID, "containers", len(spec.Rules))
		return nil
	}
	return podtable.Admission{Commit: commit, Undo: m.SandboxGone}, nil
}

// stopPodSandbox: the kubelet is stopping the pod (deleted, or terminal); a
// restart in progress is abandoned, the pod is shown as it really is, and no
// rule restarts anything in it any more.
func (m *Manager) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	var err error
	m.with(req.PodSandboxId, func(p *restartrecord.Pod) {
		if p == nil || p.Stopped {
			return
		}
		phase := p.Phase
		if err = m.abandon(p); err == nil && phase != restartrecord.PhaseRunning {
			m.log.Info("podstate: pod is being stopped; restart abandoned", "pod", p.Namespace+"/"+p.Name, "phase", phase)
		}
	})
	if err != nil {
		return nil, unavailable(err)
	}
	return next(ctx, req)
}

// SandboxGone forgets a sandbox the pod table announced gone (removed, or
// no longer listed by the runtime): the server subscribes it to the store's
// lifecycle, which removes the pod's records right after; a save of a pod
// no longer tracked is refused (restartrecord.ErrRemoved), so none is
// written again.
func (m *Manager) SandboxGone(id string) {
	m.with(id, func(p *restartrecord.Pod) {
		if p == nil {
			return
		}
		m.dropLocked(id)
		// Its slots now, so that the slot writer forgets their sequence
		// too (the store removes the files again, finding none).
		if err := m.st.Remove(id); err != nil {
			m.log.Warn("podstate: removing the state of a sandbox that is gone", "sandbox", id, "err", err)
		}
		m.log.Info("podstate: sandbox gone; state dropped", "pod", p.Namespace+"/"+p.Name, "sandbox", id)
	})
}

// dropLocked forgets a sandbox's pod, if tracked, and cancels its step in progress;
// it returns the pod forgotten. The caller holds m.mu.
func (m *Manager) dropLocked(id string) *restartrecord.Pod {
	p := m.pods.Drop(id)
	if p == nil {
		return nil
	}
	m.reads.Delete(id)
	m.traces.Delete(id)
	m.cancelStep(id)
	m.tracked.Store(int32(m.pods.Len()))
	// Only the curve keys this sandbox owns: another (live) sandbox of the
	// same pod keeps its position (backoff.Tracker).
	m.bo.Forget(p.UID, id)
	return p
}
