package podstate

// Container calls: the kubelet's creates are recorded (replayed by a restart),
// its stops and removes of instances a restart owns are answered by the
// restart.

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// CreateContainer records the kubelet's create of a tracked pod's container
// (its request, for replays) before passing it on.
func (m *Manager) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	// While a pod restarts, the kubelet still sees its old containers running
	// and may create the next one (a main container after a sidecar it sees
	// started); that creation waits for the restart to finish, so the pod's
	// start order holds. The kubelet's own deadline (--runtime-request-timeout,
	// 2 minutes by default) bounds the wait. A container the restart creates
	// itself is refused at once (replace.go).
	if err := m.refuseReplacement(req); err != nil {
		return nil, err
	}
	if m.debug {
		m.trace(req.PodSandboxId, traceKubeCreate, "name", req.GetConfig().GetMetadata().GetName())
	}
	if err := m.waitIdle(ctx, req.PodSandboxId); err != nil {
		return nil, err
	}
	completed := m.completedBefore(ctx, req)
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := m.recordCreate(req, resp.ContainerId, completed); err != nil {
		// A container the shim has no record of could not be replayed
		// after a restart of the shim: it is removed again and the kubelet
		// retries the create.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, rerr := m.rt.RemoveContainer(rctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.ContainerId}); rerr != nil && status.Code(rerr) != codes.NotFound {
			m.log.Error("podstate: removing a container whose creation could not be recorded", "container", resp.ContainerId, "err", rerr)
		}
		if errors.Is(err, errdefs.ErrUnavailable) {
			m.log.Info("podstate: refusing the kubelet's create of a container overtaken by a restart", "err", err)
			return nil, err
		}
		return nil, unavailable(err)
	}
	return resp, nil
}

// completedBefore returns, for the first creation of a container name in a
// tracked pod, the name of the container the kubelet created just before it
// when that one's newest instance has exited 0: a regular init container,
// which a restart must wait for. "" otherwise.
func (m *Manager) completedBefore(ctx context.Context, req *runtimeapi.CreateContainerRequest) string {
	name, prev, prevID := req.GetConfig().GetMetadata().GetName(), "", ""
	m.with(req.PodSandboxId, func(p *restartrecord.Pod) {
		if p == nil || len(p.Seq) == 0 || slices.ContainsFunc(p.Seq, func(e restartrecord.SeqEntry) bool { return e.Name == name }) {
			return
		}
		prev = p.Seq[len(p.Seq)-1].Name
		prevID = p.Latest[prev]
	})
	if prev == "" {
		return ""
	}
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: prevID})
	if err == nil && st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED && st.GetStatus().GetExitCode() == 0 {
		return prev
	}
	return ""
}

// recordCreate remembers a kubelet-created container of a tracked pod
// (Records.KubeletCreated), completed being completedBefore's answer. When
// that cannot be recorded nothing changes.
func (m *Manager) recordCreate(req *runtimeapi.CreateContainerRequest, id, completed string) error {
	name := req.GetConfig().GetMetadata().GetName()
	return ignoreUntracked(m.update(req.PodSandboxId, func(p *restartrecord.Pod) error {
		if p.Phase != restartrecord.PhaseRunning {
			return errRestartBegan(p, name) // race.go
		}
		b, _ := proto.Marshal(req) // nil on an error: the recorded request stays
		m.pods.KubeletCreated(p, id, name, b, completed)
		return nil
	}))
}

// StopContainer: the kubelet stops a container itself (the pod is being
// deleted, a liveness probe failed). An exit the stop causes is the
// kubelet's decision, so no rule restarts it; an exit before the stop was
// asked is the container's own and keeps its rule (replace.go). The time
// the stop was asked is recorded before the stop acts, and the exit is
// classified before the kubelet, which waits for this answer, creates the
// next instance.
func (m *Manager) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest,
	next proxy.UnaryNext[runtimeapi.StopContainerRequest, runtimeapi.StopContainerResponse]) (*runtimeapi.StopContainerResponse, error) {
	asked := m.clock.Now()
	m.traceContainer(req.ContainerId, traceKubeStop)
	sb, record, settle := "", false, false
	m.withContainer(req.ContainerId, func(p *restartrecord.Pod, in *restartrecord.Instance) {
		if in != nil && !in.Settled {
			// Recorded in every phase: an exit classified later (after a
			// restart of another container, a hold) is told by it too.
			sb, record = p.SandboxID, in.StopAsked.IsZero() // a retried stop keeps the first time
			settle = p.NeedsClassification(req.ContainerId, in.Name)
		}
	})
	if record {
		if err := ignoreUntracked(m.update(sb, func(p *restartrecord.Pod) error {
			if in := p.Inst(req.ContainerId); in != nil {
				in.StopAsked = asked
			}
			return nil
		})); err != nil {
			// Not stopped: unrecorded, a rule could restart it after a
			// restart of the shim. The kubelet retries.
			return nil, unavailable(err)
		}
	}
	resp, err := next(ctx, req)
	if err == nil && settle {
		if err := m.settleStopped(ctx, sb, req.ContainerId); err != nil {
			return nil, unavailable(err) // unsettled still: the retried stop classifies it
		}
	}
	return resp, err
}

// removeContainer forgets an instance the kubelet's container GC removed, so
// a crash-looping pod's record (saved at every restart step) does not grow
// with every restart. Not saved here: the next step's save carries it, and a
// restarted shim prunes what the runtime no longer has (reconcile).
func (m *Manager) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
	next proxy.UnaryNext[runtimeapi.RemoveContainerRequest, runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	resp, err := next(ctx, req)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	sb := ""
	m.withContainer(req.ContainerId, func(p *restartrecord.Pod, _ *restartrecord.Instance) {
		if p != nil {
			sb = p.SandboxID
			m.forget(p, req.ContainerId)
		}
	})
	if m.debug {
		m.trace(sb, traceKubeRemove, "container", req.ContainerId)
	}
	return resp, err
}
