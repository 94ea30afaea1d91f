package podmgmt

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// Manager takes part in these CRI calls (proxy hooks); none of them waits
// for a sidecar: events are queued, connections made in the background.
var (
	_ podtable.Admitter         = (*Manager)(nil)
	_ proxy.CreateContainerHook = (*Manager)(nil)
	_ proxy.StartContainerHook  = (*Manager)(nil)
	_ proxy.RemoveContainerHook = (*Manager)(nil)
	_ proxy.StopPodSandboxHook  = (*Manager)(nil)
	_ proxy.ContainerStatusHook = (*Manager)(nil)
	_ proxy.Activity            = (*Manager)(nil)
)

// HookActive: the calls only while a pod on the node has a channel (a pod
// declares one when the pod table admits it: Admit), and ContainerStatus
// only while the orchestrator overrides a status.
func (m *Manager) HookActive(method proxy.Method) bool {
	if method == proxy.ContainerStatus {
		return m.overridden.Load() > 0
	}
	return m.active.Load() > 0
}

// unavailable is the answer to a CRI call whose record could not be made
// durable: the kubelet retries it.
func unavailable(err error) error {
	return errdefs.ErrUnavailable.WithMessage(fmt.Sprintf("cri-shim pod management: %v", err))
}

// Admit reads a new pod's orchestrator declaration (podspec): once its
// sandbox exists, the channel's token and record are written. A pod whose
// channel record could not be made durable does not start: the commit fails
// (Unavailable), the pod table removes the sandbox and the kubelet retries.
func (m *Manager) Admit(_ context.Context, p *podtable.Pod) (podtable.Admission, error) {
	cfg := p.Request.GetConfig()
	md := cfg.GetMetadata()
	pod := md.GetNamespace() + "/" + md.GetName()
	for _, pr := range p.Spec.Problems {
		if pr.Feature == podspec.FeaturePodManagement {
			m.metrics.problems.Inc()
			m.log.Warn("podmgmt: "+pr.Message+"; the pod runs without a pod management channel", "pod", pod)
		}
	}
	d := p.Spec.Orchestrator
	if d == nil {
		return podtable.Admission{}, nil
	}
	if hostNetwork(cfg) {
		m.metrics.refused.WithLabelValues("host_network").Inc()
		m.log.Warn("podmgmt: refusing the orchestrator channel of a host-network pod (the shim would connect to the host, not the pod); the pod runs without it",
			"pod", pod, "container", d.Container, "port", d.Port)
		return podtable.Admission{}, nil
	}
	commit := func(_ context.Context, id string) error {
		if err := m.newPod(id, md, d); err != nil {
			m.log.Error("podmgmt: setting up the channel failed; the sandbox is removed, the kubelet retries", "pod", pod, "err", err)
			return unavailable(err)
		}
		m.log.Info("podmgmt: pod declares an orchestrator", "pod", pod, "container", d.Container, "port", d.Port)
		return nil
	}
	undo := func(id string) {
		if err := m.drop(id); err != nil {
			m.log.Warn("podmgmt: removing the record of a sandbox whose admission failed", "sandbox", id, "err", err)
		}
	}
	return podtable.Admission{Commit: commit, Undo: undo}, nil
}

// createContainer mounts the pod's token into the declared container and
// remembers its instances.
func (m *Manager) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	p := m.get(req.GetPodSandboxId())
	name := req.GetConfig().GetMetadata().GetName()
	if p == nil || name != p.Decl.Container {
		return next(ctx, req)
	}
	req.Config.Mounts = append(req.Config.Mounts, &runtimeapi.Mount{
		ContainerPath: podmanagement.TokenPath, HostPath: m.tokenPath(p.SandboxID), Readonly: true})
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.pods[p.SandboxID] == p { // not removed meanwhile
		m.orch[resp.GetContainerId()] = p.SandboxID
		p.orchIDs[resp.GetContainerId()] = true
	}
	m.mu.Unlock()
	return resp, nil
}

// startContainer starts the connector once the declared container runs (the
// KEP connects on Ready; the shim cannot see probes, so it connects on start
// and retries until the sidecar answers). STARTED notifications come from
// the runtime's events (watchEvents), which also see restarts the shim makes.
func (m *Manager) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
	next proxy.UnaryNext[runtimeapi.StartContainerRequest, runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if p := m.pods[m.orch[req.GetContainerId()]]; p != nil {
		m.connectLocked(p)
	}
	m.mu.Unlock()
	return resp, nil
}

// removeContainer forgets what the channel kept of a removed instance.
func (m *Manager) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
	next proxy.UnaryNext[runtimeapi.RemoveContainerRequest, runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	resp, err := next(ctx, req)
	if err != nil && !proxy.NotFound(err) {
		return nil, err
	}
	id := req.GetContainerId()
	m.mu.Lock()
	if p := m.pods[m.orch[id]]; p != nil {
		delete(p.orchIDs, id)
	}
	delete(m.orch, id)
	var owner *pod
	if _, ok := m.exitCodes[id]; ok {
		for _, p := range m.pods {
			if _, ok := p.Overrides[id]; ok {
				owner = p
			}
		}
	}
	m.mu.Unlock()
	if owner != nil {
		if serr := m.setExitCode(owner, id, 0, false); serr != nil {
			return nil, unavailable(serr)
		}
	}
	return resp, err
}

// stopPodSandbox closes the pod's channel for good before the sandbox is
// stopped, whatever the runtime answers: from here on no command is carried
// out and no connection made, also after a shim restart (the mark is
// recorded first; if it cannot be, the call fails Unavailable and the kubelet
// retries).
func (m *Manager) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	if p := m.get(req.GetPodSandboxId()); p != nil {
		if err := m.markTerminating(p); err != nil {
			return nil, unavailable(err)
		}
	}
	return next(ctx, req)
}

// ContainerStatus reports the exit code a TerminateContainer command asked
// for, so the kubelet sees the container end as the orchestrator meant.
func (m *Manager) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
	next proxy.UnaryNext[runtimeapi.ContainerStatusRequest, runtimeapi.ContainerStatusResponse]) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	st := resp.GetStatus()
	if st.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		return resp, nil
	}
	if code, ok := m.exitCode(st.GetId()); ok {
		st.ExitCode = code
		st.Reason = "Error"
		if code == 0 {
			st.Reason = "Completed"
		}
		st.Message = "terminated by the pod's orchestrator (pod-management)"
	}
	return resp, nil
}
