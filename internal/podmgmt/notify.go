package podmgmt

// Notifications: the runtime's container events turned into the channel's
// events and queued for the pod's orchestrator.

import (
	"slices"
	"strconv"
	"time"

	"github.com/cri-shim/cri-shim/internal/events"

	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
)

// notify queues an event for the pod's sidecar; a full queue drops it (counted
// and logged) rather than ever holding up a CRI call.
func (m *Manager) notify(p *pod, ev *pb.ContainerEvent) {
	if p.terminating.Load() {
		return // the channel is closed with the sandbox
	}
	select {
	case p.queue <- ev:
	default:
		p.dropped.Add(1)
		m.metrics.dropped.Inc()
		m.log.Warn("podmgmt: notification queue full; event dropped (the sidecar gets the current state on its next reconnect)",
			"pod", p.Namespace+"/"+p.Name, "container", ev.ContainerName, "event", ev.Type.String())
	}
}

// event builds a notification from a container status.
func (m *Manager) event(p *pod, st *runtimeapi.ContainerStatus, t pb.EventType, msg string) *pb.ContainerEvent {
	ev := &pb.ContainerEvent{ContainerName: st.GetMetadata().GetName(), Type: t, Message: msg}
	if n, err := strconv.Atoi(st.GetAnnotations()["io.kubernetes.container.restartCount"]); err == nil {
		ev.RestartCount = int32(n)
	}
	switch t {
	case pb.EventType_STARTED:
		ev.Time = timestamppb.New(time.Unix(0, st.GetStartedAt()))
	case pb.EventType_EXITED:
		ev.Time = timestamppb.New(time.Unix(0, st.GetFinishedAt()))
		ev.ExitCode = st.GetExitCode()
		if code, ok := m.exitCode(st.GetId()); ok {
			ev.ExitCode = code
			ev.Message = "terminated by the orchestrator"
		}
		if ev.Message == "" {
			ev.Message = st.GetReason()
		}
	}
	return ev
}

// OnEvent takes the runtime's container events (the shim's event feed):
// every start and exit of a tracked pod's containers, including those the
// restart machinery makes itself, becomes a notification. It never blocks: the
// pod's queue is bounded and drops on overflow.
func (m *Manager) OnEvent(e *events.Event) {
	var t pb.EventType
	switch e.Type {
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		t = pb.EventType_STARTED
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		t = pb.EventType_EXITED
	default:
		return
	}
	if m.active.Load() == 0 {
		return
	}
	p := m.get(e.SandboxID)
	if p == nil {
		return
	}
	cs, err := e.Status()
	if err != nil {
		m.log.Warn("podmgmt: container event without a readable status", "container", e.ContainerID, "err", err)
		return
	}
	if cs != nil {
		m.notify(p, m.event(p, cs, t, ""))
	}
}

// sortEvents orders a state snapshot by time, so that a sidecar replaying it
// ends with the current picture.
func sortEvents(evs []*pb.ContainerEvent) {
	slices.SortStableFunc(evs, func(a, b *pb.ContainerEvent) int {
		return a.GetTime().AsTime().Compare(b.GetTime().AsTime())
	})
}
