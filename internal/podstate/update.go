package podstate

// Access to the tracked pods' records (m.pods, restartrecord.Records). The
// restart's steps and the calls that change a pod's record go through with
// and update, as a bolt database's readers and writers go through View and
// Update: one place takes the lock, and the records' Change saves a change
// or puts the pod back when it could not be recorded. The kubelet's view
// (list, status, events) takes the lock itself: its paths are the hot ones.
// Every phase change goes through enter, which wakes the calls waiting for
// a pod's restart to end.

import (
	"errors"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// errNotTracked: the sandbox has no pod in the table (never had restart
// rules, or gone since).
var errNotTracked = errors.New("the pod is not tracked by cri-shim's restart machinery")

// with runs f on a sandbox's pod (nil when untracked) with the table
// locked. f reads, or changes what is not recorded (in-memory fields, or
// what the next save carries); it must not call the runtime or wait.
func (m *Manager) with(sandboxID string, f func(p *restartrecord.Pod)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m.pods.Get(sandboxID))
}

// withContainer is with for the pod of a container instance and the
// instance (both nil when untracked).
func (m *Manager) withContainer(id string, f func(p *restartrecord.Pod, in *restartrecord.Instance)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods.Of(id)
	if p == nil {
		f(nil, nil)
		return
	}
	f(p, p.Inst(id))
}

// update changes a sandbox's pod and records it durably. When change
// fails, or its record could not be written, the pod is put back as it was
// and the error returned: nothing changed. errNotTracked when the sandbox
// has no pod.
func (m *Manager) update(sandboxID string, change func(p *restartrecord.Pod) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods.Get(sandboxID)
	if p == nil {
		return errNotTracked
	}
	return m.pods.Update(p, change)
}

// ignoreUntracked treats errNotTracked as nothing to do.
func ignoreUntracked(err error) error {
	if errors.Is(err, errNotTracked) {
		return nil
	}
	return err
}

// enter is Pod.Enter, waking the callers waiting for a phase change
// (waitIdle). The caller holds m.mu, and commits p's change.
func (m *Manager) enter(p *restartrecord.Pod, ev restartrecord.Event) error {
	if err := p.Enter(ev, m.clock.Now()); err != nil {
		return err
	}
	m.changed()
	return nil
}

// changed wakes the waits on phaseWait. The caller holds m.mu.
func (m *Manager) changed() {
	if m.phaseChanged != nil {
		close(m.phaseChanged)
	}
	m.phaseChanged = make(chan struct{})
}

// phaseWait is a channel closed at the next phase change of any pod, or
// instance forgotten. The caller holds m.mu.
func (m *Manager) phaseWait() <-chan struct{} {
	if m.phaseChanged == nil {
		m.phaseChanged = make(chan struct{})
	}
	return m.phaseChanged
}
