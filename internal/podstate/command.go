package podstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// RestartContainer restarts one container of a tracked pod on command, through
// the same machinery as a Restart rule (its backoff applies): the running
// instance is stopped and its exit classified as Restart.
func (m *Manager) RestartContainer(ctx context.Context, sandboxID, container, reason string) error {
	return m.command(ctx, sandboxID, container, string(corev1.ContainerRestartRuleActionRestart), reason)
}

// RestartPod restarts every container of a tracked pod in place on command, as
// a RestartAllContainers rule would: the newest running container is stopped
// and its exit classified as RestartAllContainers.
func (m *Manager) RestartPod(ctx context.Context, sandboxID, reason string) error {
	return m.command(ctx, sandboxID, "", string(podspec.ActionRestartAllContainers), reason)
}

func (m *Manager) command(ctx context.Context, sandboxID, container, action, reason string) error {
	var p *restartrecord.Pod
	err := errNotTracked
	m.with(sandboxID, func(pod *restartrecord.Pod) {
		switch {
		case pod == nil:
		case pod.Stopped:
			err = errors.New("the pod is terminating")
		case pod.Phase != restartrecord.PhaseRunning:
			err = fmt.Errorf("a restart of the pod is already in progress (%s)", pod.Phase)
		default:
			p, err = pod, nil
		}
	})
	if err != nil {
		return err
	}
	r, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: sandboxID, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return err
	}
	var target *runtimeapi.Container
	for _, c := range r.GetContainers() {
		n := c.GetMetadata().GetName()
		if container != "" && n != container {
			continue
		}
		if target == nil || c.GetCreatedAt() > target.GetCreatedAt() {
			target = c
		}
	}
	if target == nil {
		if container != "" {
			if handled, err := m.restartHeld(ctx, p, container, reason); handled {
				return err
			}
			return fmt.Errorf("container %q is not running", container)
		}
		return errors.New("no container of the pod is running")
	}
	name := target.GetMetadata().GetName()
	if err := m.update(sandboxID, func(p *restartrecord.Pod) error {
		p.Force(name, action)
		// The orchestrator restarting a container (or the pod) ends the
		// hold of what it terminated (hold.go).
		if action == string(podspec.ActionRestartAllContainers) {
			p.Held = nil
		} else {
			delete(p.Held, name)
		}
		return nil
	}); err != nil {
		return err
	}
	m.log.Info("podstate: restart on command", "pod", p.Namespace+"/"+p.Name, "container", name, "action", action, "reason", reason)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if _, err := m.rt.StopContainer(sctx, &runtimeapi.StopContainerRequest{ContainerId: target.GetId(), Timeout: 10}); err != nil {
		if serr := ignoreUntracked(m.update(sandboxID, func(p *restartrecord.Pod) error {
			delete(p.Forced, name)
			return nil
		})); serr != nil {
			// The record still forces the next exit of this container, and
			// so does memory: what runs is what a restarted shim would do.
			m.log.Warn("podstate: the forced action of a failed command stays recorded", "pod", p.Namespace+"/"+p.Name, "container", name, "err", serr)
		}
		return err
	}
	return nil
}
