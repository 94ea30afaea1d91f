package podmgmt

import (
	"context"
	"os"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// Routes are the CRI calls the channel takes part in. None of them waits for
// a sidecar: events are queued, connections made in the background.
func (m *Manager) Routes() []proxy.Route {
	const svc = "/runtime.v1.RuntimeService/"
	active := func() bool { return m.active.Load() > 0 }
	return []proxy.Route{
		proxy.Unary(svc+"RunPodSandbox", m.runPodSandbox),
		proxy.UnaryIf(svc+"CreateContainer", active, m.createContainer),
		proxy.UnaryIf(svc+"StartContainer", active, m.startContainer),
		proxy.UnaryIf(svc+"StopPodSandbox", active, m.stopPodSandbox),
		proxy.UnaryIf(svc+"RemovePodSandbox", active, m.removePodSandbox),
		proxy.UnaryIf(svc+"ContainerStatus", func() bool { return m.overridden.Load() > 0 }, m.containerStatus),
	}
}

func (m *Manager) runPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	d, problems := ParseAnnotations(req.GetConfig().GetAnnotations())
	md := req.GetConfig().GetMetadata()
	for _, pr := range problems {
		m.metrics.problems.Inc()
		m.log.Warn("podmgmt: "+pr+"; the pod runs without a pod management channel", "pod", md.GetNamespace()+"/"+md.GetName())
	}
	if d != nil {
		if err := m.newPod(resp.PodSandboxId, md, d); err != nil {
			m.log.Error("podmgmt: setting up the channel; the pod runs without it", "pod", md.GetNamespace()+"/"+md.GetName(), "err", err)
		} else {
			m.log.Info("podmgmt: pod declares an orchestrator", "pod", md.GetNamespace()+"/"+md.GetName(), "container", d.Container, "port", d.Port)
		}
	}
	return resp, nil
}

// createContainer mounts the pod's token into the declared container and
// remembers container names.
func (m *Manager) createContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	p := m.get(req.GetPodSandboxId())
	if p == nil {
		return next(ctx, req)
	}
	name := req.GetConfig().GetMetadata().GetName()
	if name == p.Decl.Container && req.GetConfig() != nil {
		req.Config.Mounts = append(req.Config.Mounts, &runtimeapi.Mount{
			ContainerPath: podmanagement.TokenPath, HostPath: m.tokenPath(p.SandboxID), Readonly: true})
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	p.Names[resp.GetContainerId()] = name
	m.save(p)
	m.mu.Unlock()
	return resp, nil
}

// startContainer starts the connector once the declared container runs (the
// KEP connects on Ready; the shim cannot see probes, so it connects on start
// and retries until the sidecar answers). STARTED notifications come from
// the runtime's events (watchEvents), which also see restarts the shim makes.
func (m *Manager) startContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
	next proxy.UnaryNext[runtimeapi.StartContainerRequest, runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	for _, p := range m.pods {
		if n, ok := p.Names[req.GetContainerId()]; ok {
			if n == p.Decl.Container {
				m.connectLocked(p)
			}
			break
		}
	}
	m.mu.Unlock()
	return resp, nil
}

func (m *Manager) stopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	if p := m.get(req.GetPodSandboxId()); p != nil {
		p.terminating.Store(true) // commands are refused from here on
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if p := m.get(req.GetPodSandboxId()); p != nil {
		m.stop(p)
	}
	return resp, nil
}

func (m *Manager) removePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if p := m.get(req.GetPodSandboxId()); p != nil {
		m.stop(p)
		m.mu.Lock()
		delete(m.pods, p.SandboxID)
		for id := range p.Overrides {
			delete(m.exitCodes, id)
		}
		m.active.Store(int32(len(m.pods)))
		m.overridden.Store(int32(len(m.exitCodes)))
		m.mu.Unlock()
		m.metrics.connected.DeleteLabelValues(p.Namespace, p.Name)
		os.RemoveAll(m.podDir(p.SandboxID))
	}
	return resp, nil
}

// containerStatus reports the exit code a TerminateContainer command asked
// for, so the kubelet sees the container end as the orchestrator meant.
func (m *Manager) containerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
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
