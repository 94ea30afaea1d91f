package podmgmt

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
)

// commands serves the sidecar's command stream until it fails.
func (m *Manager) commands(ctx context.Context, p *pod, c pb.PodManagementClient) error {
	s, err := c.CommandStream(ctx)
	if err != nil {
		return err
	}
	for {
		cmd, err := s.Recv()
		if err != nil {
			return err
		}
		typ, res := m.do(ctx, p, cmd)
		res.Id = cmd.GetId()
		m.metrics.commands.WithLabelValues(typ, res.GetResult().String()).Inc()
		m.log.Info("podmgmt: command", "pod", p.Namespace+"/"+p.Name, "type", typ, "result", res.GetResult().String(), "detail", res.GetErrorDescription())
		if err := s.Send(res); err != nil {
			return err
		}
	}
}

func refused(format string, a ...any) *pb.CommandResponse {
	return &pb.CommandResponse{Result: pb.CommandResult_REFUSED, ErrorDescription: fmt.Sprintf(format, a...)}
}

func failed(err error) *pb.CommandResponse {
	return &pb.CommandResponse{Result: pb.CommandResult_FAILED, ErrorDescription: err.Error()}
}

func (m *Manager) do(ctx context.Context, p *pod, cmd *pb.Command) (string, *pb.CommandResponse) {
	if p.terminating.Load() {
		return commandType(cmd), refused("the pod is terminating")
	}
	switch c := cmd.GetCommand().(type) {
	case *pb.Command_TerminateContainer:
		return "terminate_container", m.terminate(ctx, p, c.TerminateContainer.GetContainerName(), c.TerminateContainer.GetExitCode())
	case *pb.Command_RestartContainer:
		name := c.RestartContainer.GetContainerName()
		if _, err := m.running(ctx, p, name); err != nil {
			return "restart_container", refused("%v", err)
		}
		if m.restarter == nil {
			return "restart_container", refused("this cri-shim cannot restart containers on command")
		}
		if err := m.restarter.RestartContainer(ctx, p.SandboxID, name, "pod-management command"); err != nil {
			return "restart_container", failed(err)
		}
		return "restart_container", &pb.CommandResponse{Result: pb.CommandResult_ACCEPTED}
	case *pb.Command_RestartAllContainers:
		if m.restarter == nil {
			return "restart_all_containers", refused("this cri-shim cannot restart pods on command")
		}
		if err := m.restarter.RestartPod(ctx, p.SandboxID, c.RestartAllContainers.GetReason()); err != nil {
			return "restart_all_containers", failed(err)
		}
		return "restart_all_containers", &pb.CommandResponse{Result: pb.CommandResult_ACCEPTED}
	}
	return "unknown", refused("unknown command (this node agent speaks version %s)", SupportedVersions[0])
}

func commandType(cmd *pb.Command) string {
	switch cmd.GetCommand().(type) {
	case *pb.Command_TerminateContainer:
		return "terminate_container"
	case *pb.Command_RestartContainer:
		return "restart_container"
	case *pb.Command_RestartAllContainers:
		return "restart_all_containers"
	}
	return "unknown"
}

// running finds the running instance of a container of the pod.
func (m *Manager) running(ctx context.Context, p *pod, name string) (string, error) {
	r, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.SandboxID}})
	if err != nil {
		return "", err
	}
	known := false
	for _, c := range r.GetContainers() {
		if c.GetMetadata().GetName() != name {
			continue
		}
		known = true
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return c.GetId(), nil
		}
	}
	if !known {
		return "", fmt.Errorf("container %q is not in pod %s/%s", name, p.Namespace, p.Name)
	}
	return "", fmt.Errorf("container %q is not running", name)
}

// terminate stops the container (SIGTERM, then SIGKILL after 10 s) and has the
// shim report the requested exit code for it: a process's exit code cannot be
// set from outside, so the shim's ContainerStatus answers it.
func (m *Manager) terminate(ctx context.Context, p *pod, name string, code int32) *pb.CommandResponse {
	if name == p.Decl.Container {
		return refused("the orchestrator cannot terminate itself through the channel")
	}
	id, err := m.running(ctx, p, name)
	if err != nil {
		return refused("%v", err)
	}
	m.setExitCode(p, id, code, true)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if _, err := m.rt.StopContainer(sctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 10}); err != nil {
		m.setExitCode(p, id, 0, false)
		return failed(err)
	}
	return &pb.CommandResponse{Result: pb.CommandResult_ACCEPTED, ErrorDescription: fmt.Sprintf("stopped; reported exit code %d", code)}
}
