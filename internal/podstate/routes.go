package podstate

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

const svc = "/runtime.v1.RuntimeService/"

// The in-place restart takes part in these CRI calls (proxy hooks). What
// the kubelet reads (ListContainers, ContainerStatus, GetContainerEvents)
// passes through internal/restartview, which asks this package's view.go.
var (
	_ proxy.CreateContainerHook      = (*Manager)(nil)
	_ proxy.StartContainerHook       = (*Manager)(nil)
	_ proxy.StopContainerHook        = (*Manager)(nil)
	_ proxy.RemoveContainerHook      = (*Manager)(nil)
	_ proxy.StopPodSandboxHook       = (*Manager)(nil)
	_ proxy.PodSandboxStatusObserver = (*Manager)(nil)
	_ proxy.Activity                 = (*Manager)(nil)
)

// HookActive: the calls are seen only while a pod on the node is tracked
// (a pod's rules are read when the pod table admits it: Admit).
func (m *Manager) HookActive(proxy.Method) bool { return m.Tracked() > 0 }

// unavailable is the error of a call whose step was not carried out
// because its record could not be made durable: Unavailable at the proxy's
// edge (proxy.Status), so the kubelet retries it. A runtime's status passes
// as it is.
func unavailable(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return fmt.Errorf("cri-shim: %w; not carried out: %w", err, errdefs.ErrUnavailable)
}

// waitIdle returns once the sandbox has no restart in progress, woken by
// each phase change (update.go).
func (m *Manager) waitIdle(ctx context.Context, sandboxID string) error {
	for {
		busy, changed := false, (<-chan struct{})(nil)
		m.with(sandboxID, func(p *restartrecord.Pod) {
			busy, changed = p != nil && p.Phase != restartrecord.PhaseRunning, m.phaseWait()
		})
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-changed:
		}
	}
}
