package podstate

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
)

// A liveness probe during a held restart (item 11 of issue 14; docs/backoff.md).
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
	m.with(req.GetPodSandboxId(), func(p *Pod) {
		if p != nil && p.Phase != PhaseRunning && !p.Stopped && p.Replaces(name) {
			err = p.Refusal(name)
		}
	})
	if err != nil {
		m.log.Info("podstate: refusing the kubelet's create of a container the restart in progress creates itself",
			"container", name, "err", err)
	}
	return err
}

// classifyBeforeStop classifies the exit of an instance the kubelet stops
// after it exited on its own, before the kubelet's stop is taken as the
// kubelet's decision (stopContainer). A liveness probe that fails right
// after the process died reaches the kubelet before the shim has seen the
// exit (the kubelet's view predates it); the exit is the container's own, so
// its rule governs it: the restart is held on the curve, and the kubelet's
// create that follows the kill is refused (refuseReplacement). An error
// means the verdict could not be recorded.
func (m *Manager) classifyBeforeStop(ctx context.Context, id string) error {
	unsettled := false
	m.withContainer(id, func(_ *Pod, in *Instance) { unsettled = in != nil && !in.Settled })
	if !unsettled {
		return nil
	}
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil // gone or unreadable: the stop goes on as the kubelet's
	}
	_, err = m.classify(st.GetStatus())
	return err
}

// classifyAfterStop is classifyBeforeStop for an exit the runtime had not
// recorded yet when the kubelet's stop arrived. containerd reports a
// container RUNNING until it has handled its task's exit, and it deletes the
// task before it records the exit (handleContainerExit,
// internal/cri/server/events.go). A tcpSocket probe that fails on the dead
// process can land in that window: the stop then finds the exit being
// recorded (it waits for it), or no task at all, and returns at once with
// the container still RUNNING (stopContainer, container_stop.go). Either
// way the process finished before the stop was asked (containerd's exit
// time, on the host's clock like asked): it ended on its own, so its stop is
// taken back as the kubelet's decision and the exit is classified against
// its rule, before the kubelet, which waits for this answer, creates the
// next instance. An error means the verdict could not be recorded; the
// instance is then left unsettled, so the kubelet's retried stop records
// the stop and classifies the exit again.
func (m *Manager) classifyAfterStop(ctx context.Context, id string, asked time.Time) error {
	s := m.recordedExit(ctx, id)
	if s == nil || !time.Unix(0, s.FinishedAt).Before(asked) {
		return nil // the kubelet's stop ended it, or it cannot be told
	}
	var cerr error
	m.withContainer(id, func(p *Pod, in *Instance) {
		if p == nil || in == nil || !in.Settled || p.Phase != PhaseRunning {
			return
		}
		in.Settled = false
		_, cerr = m.classifyLocked(s) // puts back all but the unsettle when its save fails
		if cerr == nil {
			m.log.Info("podstate: the kubelet's stop came after the container's own exit; its rule governs that exit",
				"pod", p.Namespace+"/"+p.Name, "container", id, "exitedBeforeStop", asked.Sub(time.Unix(0, s.FinishedAt)).Round(time.Millisecond))
		}
	})
	return cerr
}

// exitRecordWait bounds how long a stop that returned with its container
// still RUNNING waits for containerd to record the exit: the task's delete
// before it unmounts the rootfs, which containerd lets take 10 s under I/O
// pressure (events.go).
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
				"container", id, "waited", exitRecordWait)
			return nil
		}
	}
}
