package podstate

// What the kubelet is shown of a tracked pod's containers: the decisions
// internal/restartview asks for as the kubelet's lists, statuses and events
// pass through it (restartview.Engine).

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// Verdicts decides, for each listed container, whether the kubelet sees it
// and whether it is shown running although it is not, after classifying
// the exits in the list no one has seen yet. A fake verdict is only given
// to a container that is not running. When an exit's verdict could not be
// recorded the list is not answered (Unavailable): shown as it is, the exit
// would have the kubelet restart the container itself.
//
// Every list records the instances it shows running (Instance.Listed), and
// a list without a state filter shows a held instance running
// (Instance.HeldUntil): the kubelet's PLEG reads the statuses of what its
// unfiltered lists showed. A state-filtered list shows held instances as
// they are: a list of running containers is how other callers
// (housekeeping, the log manager) find what still runs, and a replaced
// instance does not.
func (m *Manager) Verdicts(ctx context.Context, cs []wire.Container, want *runtimeapi.ContainerStateValue) ([]wire.Verdict, error) {
	if err := m.classifyExited(ctx, cs); err != nil {
		return nil, unavailable(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]wire.Verdict, len(cs))
	for i, c := range cs {
		state := c.State
		p := m.pods.Get(c.Sandbox)
		var in *restartrecord.Instance
		if p != nil {
			in = p.Inst(c.ID)
			hide, fake := p.View(in)
			if hide || p.PendingCreate(c.ID, c.Name) {
				out[i].Hide = true
				continue
			}
			if !fake && want == nil && m.heldLocked(p, in) {
				fake = true
			}
			if fake && state != runtimeapi.ContainerState_CONTAINER_RUNNING {
				out[i].Fake = true
				state = runtimeapi.ContainerState_CONTAINER_RUNNING
			}
		}
		if want != nil && state != want.State {
			out[i].Hide = true
			continue
		}
		if in != nil && state == runtimeapi.ContainerState_CONTAINER_RUNNING && !in.Listed {
			in.Listed = true
			m.pods.Recheck() // it may now be quiet (Records.Quiet)
		}
	}
	return out, nil
}

// StatusMayChange says whether FixStatus could do anything with this
// status: classify an exit, or show a not-running instance as running.
func (m *Manager) StatusMayChange(c wire.Container) bool {
	if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false // FixStatus only ever shows RUNNING
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.statusMayChangeLocked(c)
}

// Unchanged says whether c is an instance of a tracked pod whose status the
// view leaves as the runtime gave it (an answer kept for it may be sent
// again: restartview's exited.go).
func (m *Manager) Unchanged(c wire.Container) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods.Of(c.ID) != nil && !m.statusMayChangeLocked(c)
}

// statusMayChangeLocked is StatusMayChange with m.mu held.
func (m *Manager) statusMayChangeLocked(c wire.Container) bool {
	if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false
	}
	p := m.pods.Of(c.ID)
	if p == nil {
		return false
	}
	exited := c.State == runtimeapi.ContainerState_CONTAINER_EXITED
	in := p.Inst(c.ID)
	if in == nil {
		return false
	}
	if exited && (!in.Dead || p.NeedsClassification(c.ID, c.Name)) {
		return true
	}
	_, fake := p.View(in)
	return fake || in.Held()
}

// FixStatus classifies an exit it is the first to see and shows an old
// instance of a restarting pod, or a held one, as still running. An error
// (Unavailable): the exit's verdict could not be recorded, and the status
// must not be shown.
func (m *Manager) FixStatus(s *runtimeapi.ContainerStatus) error {
	if err := m.fixStatus(s); err != nil {
		return unavailable(err)
	}
	return nil
}

func (m *Manager) fixStatus(s *runtimeapi.ContainerStatus) error {
	if s == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
		if _, err := m.classifyLocked(s); err != nil {
			return err
		}
	}
	p := m.pods.Of(s.Id)
	if p == nil {
		return nil
	}
	in := p.Inst(s.Id)
	_, fake := p.View(in)
	if !fake && m.heldLocked(p, in) {
		fake = true // listed running before a swap: keep to that list's picture
	}
	if fake {
		s.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		s.FinishedAt, s.ExitCode, s.Reason, s.Message = 0, 0, "", ""
	}
	return nil
}

// DropEvent says whether a container event is kept from the kubelet: one
// of a restart in progress (the trigger's exit, a hidden or faked
// instance). An exit whose verdict could not be recorded is dropped too:
// the kubelet's next list is answered Unavailable until it is (Verdicts),
// so it never sees the exit unclassified.
func (m *Manager) DropEvent(e *runtimeapi.ContainerEventResponse) bool {
	for _, s := range e.ContainersStatuses {
		if s.Id != e.ContainerId {
			continue
		}
		if restarts, err := m.classify(s); restarts || err != nil {
			return true
		}
	}
	hide, fake := false, false
	m.withContainer(e.ContainerId, func(p *restartrecord.Pod, in *restartrecord.Instance) {
		if p != nil {
			hide, fake = p.View(in)
		}
	})
	if hide || fake {
		return true
	}
	for _, s := range e.ContainersStatuses {
		if err := m.fixStatus(s); err != nil {
			return true
		}
	}
	return false
}

// Interest is what Verdicts could give a verdict about or record anything
// of in an unfiltered list: an instance a tracked pod's record holds
// (hidden, shown running, held, listed, an exit to classify), whose ID's
// head is in heads, or any container of a pod whose restart is in
// progress (a create pending under its name hides it), whose sandbox ID
// restarting lists (appended to the caller's slice). Any other container,
// every container of an untracked pod among them, is shown as the runtime
// lists it, so the view leaves it out of Verdicts (restartview's
// ListContainersFrames). Of the instances, those in quiet are shown as
// they are and nothing is recorded of them when they are listed running
// (Records.Quiet): the view reads their state and leaves them out too.
// heads may hold a few IDs Verdicts then shows as they are
// (Records.Heads). One lock per list; the sets are read after it is let go
// (they do not change), so the walk of a large list takes no lock.
func (m *Manager) Interest(restarting []string) (heads, quiet *wire.HeadSet, _ []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods.Heads(), m.pods.Quiet(), append(restarting, m.pods.Restarting()...)
}
