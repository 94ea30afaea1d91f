package podstate

// Access to the pod table (m.pods, m.byID and the pods in them). The
// restart's steps and the calls that change a pod's record go through with
// and update, as a bolt database's readers and writers go through View and
// Update: one place takes the lock, and one place saves a change and puts
// the pod back when the change could not be recorded. The kubelet's view
// (list, status, events) takes the lock itself: its paths are the hot ones.

import "errors"

// errNotTracked: the sandbox has no pod in the table (never had restart
// rules, or gone since).
var errNotTracked = errors.New("the pod is not tracked by cri-shim's restart machinery")

// with runs f on a sandbox's pod (nil when untracked) with the table
// locked. f reads, or changes what is not recorded (in-memory fields, or
// what the next save carries); it must not call the runtime or wait.
func (m *Manager) with(sandboxID string, f func(p *Pod)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m.pods[sandboxID])
}

// withContainer is with for the pod of a container instance and the
// instance (both nil when untracked).
func (m *Manager) withContainer(id string, f func(p *Pod, in *Instance)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[m.byID[id]]
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
func (m *Manager) update(sandboxID string, change func(p *Pod) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[sandboxID]
	if p == nil {
		return errNotTracked
	}
	return m.updateLocked(p, change)
}

// updateLocked is update of p with m.mu held.
func (m *Manager) updateLocked(p *Pod, change func(p *Pod) error) error {
	snap, saves := p.Snapshot(), m.saves
	err := change(p)
	if err == nil {
		err = m.save(p)
	}
	if err != nil {
		m.rollback(p, snap)
		if m.saves != saves {
			// A step inside change recorded part of it: the record goes
			// back too (a failure is logged by save; the next save
			// carries it).
			_ = m.save(p)
		}
	}
	return err
}

// rollback puts p back to snap (p.Snapshot) after a change that could not
// be recorded; the container index follows its instances. m.mu held.
func (m *Manager) rollback(p *Pod, snap Pod) {
	for id := range p.Instances {
		if _, ok := snap.Instances[id]; !ok {
			delete(m.byID, id)
		}
	}
	for id := range snap.Instances {
		m.byID[id] = p.SandboxID
	}
	*p = snap
}

// ignoreUntracked treats errNotTracked as nothing to do.
func ignoreUntracked(err error) error {
	if errors.Is(err, errNotTracked) {
		return nil
	}
	return err
}
