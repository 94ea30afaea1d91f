package podstate

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// The kubelet's create and start of a container racing a rule match.
//
// The kubelet creates a pod's next container as soon as it sees the one
// before it started (a main container after a sidecar), and a sidecar with
// a rule can exit before that create or start is done. A container the
// kubelet creates or starts while a restart begins must not run beside the
// restart, nor be stopped by it in the kubelet's sight: the kubelet would
// see it exit and, under restartPolicy Never, fail the pod (seen on the
// real stack: TestInPlaceRestartFromSidecar, a sidecar exiting 88 at once).
//   - A create overtaken by a match is refused and its container removed
//     (recordCreate, errRestartBegan); the kubelet creates it again after
//     the swap.
//   - A start of an instance the restart replaces is refused once the
//     restart has begun; the restart starts the next instance itself.
//   - A start already in the runtime when the rule matches is waited for:
//     the instance is shown running like every other old instance that ran,
//     and the restart stops it only after the start has returned
//     (step), so the stop cannot come before the process does.

// errRestartBegan is recordCreate's refusal of a container whose create
// was overtaken by a rule match: CreateContainer removes it again.
func errRestartBegan(p *restartrecord.Pod, name string) error {
	return fmt.Errorf("cri-shim: pod %s/%s began an in-place restart (%s) while container %q was being created; "+
		"the kubelet creates it again after the restart: %w", p.Namespace, p.Name, p.Phase, name, errdefs.ErrUnavailable)
}

// StartContainer refuses the kubelet's start of an instance that a restart
// in progress owns, and marks the others as starting while the runtime
// starts them.
func (m *Manager) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
	next proxy.UnaryNext[runtimeapi.StartContainerRequest, runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	var err error
	tracked := false
	m.withContainer(req.ContainerId, func(p *restartrecord.Pod, in *restartrecord.Instance) {
		switch {
		case p == nil || in == nil:
		case p.Phase != restartrecord.PhaseRunning && !p.Stopped && in.Part == restartrecord.PartOld:
			err = fmt.Errorf("cri-shim: container %q of pod %s/%s is being restarted in place (%s); "+
				"its restart starts the next instance, this one is not started: %w",
				in.Name, p.Namespace, p.Name, p.Phase, errdefs.ErrUnavailable)
		default:
			in.Starting, tracked = true, true
		}
	})
	if err != nil {
		m.log.Info("podstate: refusing the kubelet's start of a container the restart in progress replaces", "container", req.ContainerId, "err", err)
		return nil, err
	}
	m.traceContainer(req.ContainerId, traceKubeStart)
	resp, err := next(ctx, req)
	if tracked {
		kick := ""
		m.withContainer(req.ContainerId, func(p *restartrecord.Pod, in *restartrecord.Instance) {
			if p == nil || in == nil {
				return
			}
			in.Starting = false
			if p.Phase != restartrecord.PhaseRunning {
				kick = p.SandboxID // the restart's step waits for this start
			}
		})
		if kick != "" {
			m.kick(kick)
		}
	}
	return resp, err
}

// startWait is how soon a restart step that found a kubelet start in
// flight looks again (the start's return also queues it: StartContainer).
const startWait = 50 * time.Millisecond
