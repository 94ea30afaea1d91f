package podmgmt

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/podspec"
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
		if err := m.restartable(ctx, p, name); err != nil {
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
	return "unknown", refused("unknown command (this node agent speaks version %s)", podspec.SupportedVersions[0])
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
	run, _, err := m.instances(ctx, p, name)
	if err != nil {
		return "", err
	}
	if run == nil {
		return "", fmt.Errorf("container %q is not running", name)
	}
	return run.GetId(), nil
}

// instances finds a container's running instance and its newest one.
func (m *Manager) instances(ctx context.Context, p *pod, name string) (running, latest *runtimeapi.Container, err error) {
	r, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.SandboxID}})
	if err != nil {
		return nil, nil, err
	}
	for _, c := range r.GetContainers() {
		if c.GetMetadata().GetName() != name {
			continue
		}
		if latest == nil || c.GetCreatedAt() > latest.GetCreatedAt() {
			latest = c
		}
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running = c
		}
	}
	if latest == nil {
		return nil, nil, fmt.Errorf("container %q is not in pod %s/%s", name, p.Namespace, p.Name)
	}
	return running, latest, nil
}

// restartable: a container may be restarted on command while it runs, or
// when its newest instance exited because the orchestrator terminated it
// (held since by the restart machinery).
func (m *Manager) restartable(ctx context.Context, p *pod, name string) error {
	run, latest, err := m.instances(ctx, p, name)
	if err != nil || run != nil {
		return err
	}
	if _, ok := m.exitCode(latest.GetId()); ok && latest.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
		return nil
	}
	return fmt.Errorf("container %q is not running", name)
}

// terminate stops the container (SIGTERM, then SIGKILL after 10 s) and has the
// shim report the requested exit code for it: a process's exit code cannot be
// set from outside, so the shim's ContainerStatus answers it. The container
// stays terminated: the restart machinery holds it (the pod's restart rules
// leave its exits alone) until the orchestrator restarts it. Both records are
// durable before the container is stopped; a failure to write either fails
// the command and stops nothing.
func (m *Manager) terminate(ctx context.Context, p *pod, name string, code int32) (resp *pb.CommandResponse) {
	if name == p.Decl.Container {
		return refused("the orchestrator cannot terminate itself through the channel")
	}
	id, err := m.running(ctx, p, name)
	if err != nil {
		return refused("%v", err)
	}
	if err := m.setExitCode(p, id, code, true); err != nil {
		return failed(err)
	}
	held := false
	defer func() {
		if resp.GetResult() == pb.CommandResult_ACCEPTED {
			return
		}
		if held {
			if err := m.restarter.HoldContainer(context.WithoutCancel(ctx), p.SandboxID, name, false); err != nil {
				m.log.Error("podmgmt: releasing the hold of a container a failed TerminateContainer did not stop", "pod", p.Namespace+"/"+p.Name, "container", name, "err", err)
			}
		}
		if err := m.setExitCode(p, id, 0, false); err != nil {
			m.log.Error("podmgmt: forgetting the exit code of a failed TerminateContainer", "pod", p.Namespace+"/"+p.Name, "container", name, "err", err)
		}
	}()
	if m.restarter != nil {
		if err := m.restarter.HoldContainer(ctx, p.SandboxID, name, true); err != nil {
			return failed(fmt.Errorf("holding the container terminated: %w", err))
		}
		held = true
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if _, err := m.rt.StopContainer(sctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 10}); err != nil {
		return failed(err)
	}
	return &pb.CommandResponse{Result: pb.CommandResult_ACCEPTED, ErrorDescription: fmt.Sprintf("stopped; reported exit code %d; held until the orchestrator restarts it", code)}
}
