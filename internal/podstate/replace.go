package podstate

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// A liveness probe during a held restart (docs/backoff.md).
//
// While a restart waits out its backoff delay the kubelet sees the exited
// instance as running. A probe that fails on the dead process (tcpSocket,
// httpGet: the kubelet dials the pod) makes the kubelet kill that instance
// and, under restartPolicy Always or OnFailure, create the next one in the
// same sync (pkg/kubelet/kuberuntime/kuberuntime_manager.go,
// computePodActions: "failed liveness probe, will be restarted"), without
// its own backoff, since it saw no exit. The restart in progress creates
// that instance itself when the delay is over. The kubelet's create used to
// wait for the restart to finish (waitIdle), holding the kubelet's pod
// worker for the rest of the delay (a pod deleted meanwhile waited too), and
// then reached containerd, where only the name containerd reserves for an
// attempt number kept a second instance from running. It is refused at once
// instead; the kubelet retries at its next sync, when it sees the restarted
// instance running and keeps it.

// refuseReplacement refuses a CreateContainer of a container whose next
// instance a restart in progress in the same pod creates itself.
func (m *Manager) refuseReplacement(req *runtimeapi.CreateContainerRequest) error {
	name := req.GetConfig().GetMetadata().GetName()
	var err error
	m.with(req.GetPodSandboxId(), func(p *restartrecord.Pod) {
		if p != nil && p.Phase != restartrecord.PhaseRunning && !p.Stopped && p.Replaces(name) {
			err = p.Refusal(name)
		}
	})
	if err != nil {
		m.log.Info("podstate: refusing the kubelet's create of a container the restart in progress creates itself",
			"container", name, "err", err)
	}
	return err
}

// A stop that races the container's own exit (liveness, as above): a probe
// that fails right after the process died reaches the kubelet, whose view
// predates the exit, and its StopContainer can reach the shim before the
// exit is seen, or before containerd has recorded it. containerd reports a
// container RUNNING until it has handled its task's exit, and it deletes the
// task before it records the exit (handleContainerExit,
// internal/cri/server/events.go); a stop in that window finds the exit
// being recorded (and waits for it) or no task at all (and returns at once,
// the container still RUNNING: stopContainer, container_stop.go). The exit
// time containerd records tells whose exit it was (StopAsked), once it is
// recorded: the stop waits for that (recordedExit).

// settleStopped classifies the exit of instance id, which the kubelet
// stopped, once containerd has recorded it; one that cannot be read, or is
// not recorded within exitRecordWait, is taken as the kubelet's decision.
func (m *Manager) settleStopped(ctx context.Context, sandboxID, id string) error {
	if s := m.recordedExit(ctx, id); s != nil {
		restarts, err := m.classify(s)
		if restarts {
			m.log.Info("podstate: the kubelet's stop came after the container's own exit; its rule governs that exit", "container", id)
		}
		return err
	}
	return ignoreUntracked(m.update(sandboxID, func(p *restartrecord.Pod) error {
		p.Settle(id)
		return nil
	}))
}

// exitRecordWait bounds how long a stop that returned with its container
// still RUNNING waits for containerd to record the exit: containerd gives
// the task's delete (which unmounts the rootfs) 10 s, then retries the exit
// with a backoff (handleEventTimeout, events.go).
const exitRecordWait = 10 * time.Second

// recordedExit is container id's status once containerd has recorded its
// exit, or nil if it cannot be read or is not recorded within
// exitRecordWait.
func (m *Manager) recordedExit(ctx context.Context, id string) *runtimeapi.ContainerStatus {
	ctx, cancel := context.WithTimeout(ctx, exitRecordWait)
	defer cancel()
	for {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		s := st.GetStatus()
		switch {
		case err != nil:
			return nil
		case s.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED && s.FinishedAt != 0:
			return s
		case s.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING:
			return nil
		}
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			m.log.Info("podstate: a stopped container is still running in the runtime's status; its exit is taken as the kubelet's",
				"container", id)
			return nil
		}
	}
}
