package podmgmt

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// Manager takes part in these CRI calls (proxy hooks); none of them waits
// for a sidecar: events are queued, connections made in the background.
var (
	_ proxy.RunPodSandboxHook   = (*Manager)(nil)
	_ proxy.CreateContainerHook = (*Manager)(nil)
	_ proxy.StartContainerHook  = (*Manager)(nil)
	_ proxy.RemoveContainerHook = (*Manager)(nil)
	_ proxy.StopPodSandboxHook  = (*Manager)(nil)
	_ proxy.ContainerStatusHook = (*Manager)(nil)
	_ proxy.Activity            = (*Manager)(nil)
)

// HookActive: RunPodSandbox is always seen (it is where a pod declares an
// orchestrator); the other calls only while a pod on the node has one, and
// ContainerStatus only while the orchestrator overrides a status.
func (m *Manager) HookActive(method proxy.Method) bool {
	switch method {
	case proxy.RunPodSandbox:
		return true
	case proxy.ContainerStatus:
		return m.overridden.Load() > 0
	}
	return m.active.Load() > 0
}

// unavailable is the answer to a CRI call whose record could not be made
// durable: the kubelet retries it.
func unavailable(err error) error {
	return errdefs.ErrUnavailable.WithMessage(fmt.Sprintf("cri-shim pod management: %v", err))
}

// notFound reports whether err, from the runtime or a feature after this one,
// is NotFound, which the kubelet takes as already removed.
func notFound(err error) bool {
	return status.Code(proxy.Status(err)) == codes.NotFound
}

func (m *Manager) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	d, problems := podspec.ParseOrchestrator(req.GetConfig().GetAnnotations())
	md := req.GetConfig().GetMetadata()
	pod := md.GetNamespace() + "/" + md.GetName()
	for _, pr := range problems {
		m.metrics.problems.Inc()
		m.log.Warn("podmgmt: "+pr+"; the pod runs without a pod management channel", "pod", pod)
	}
	if d != nil && hostNetwork(req.GetConfig()) {
		m.metrics.refused.WithLabelValues("host_network").Inc()
		m.log.Warn("podmgmt: refusing the orchestrator channel of a host-network pod (the shim would connect to the host, not the pod); the pod runs without it",
			"pod", pod, "container", d.Container, "port", d.Port)
		d = nil
	}
	resp, err := next(ctx, req)
	if err != nil || d == nil {
		return resp, err
	}
	if err := m.newPod(resp.PodSandboxId, md, d); err != nil {
		// A pod whose channel record could not be made durable does not
		// start: its sandbox is taken down again and the kubelet retries.
		m.log.Error("podmgmt: setting up the channel failed; removing the sandbox, the kubelet retries", "pod", pod, "err", err)
		m.rollbackSandbox(ctx, resp.PodSandboxId)
		return nil, unavailable(err)
	}
	m.log.Info("podmgmt: pod declares an orchestrator", "pod", pod, "container", d.Container, "port", d.Port)
	return resp, nil
}

// rollbackSandbox stops and removes a sandbox this call created, under a
// fresh context (the caller's may be the reason it failed).
func (m *Manager) rollbackSandbox(ctx context.Context, id string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := m.rt.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		m.log.Error("podmgmt: stopping the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
	if _, err := m.rt.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		m.log.Error("podmgmt: removing the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
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
	if err != nil && !notFound(err) {
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
