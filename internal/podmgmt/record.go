package podmgmt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cri-shim/cri-shim/internal/statefile"
	"github.com/cri-shim/cri-shim/internal/store"
)

// A pod's records are kept in the state store (internal/store), one file per
// sandbox in each of two buckets: "podmgmt" holds the pod (its declaration,
// the exit codes the orchestrator asked for, whether the sandbox is being
// stopped), "podmgmt-state" the channel's state line that `cri-shim pods`
// shows. The state line has its own file so that writing it never makes
// durable an in-memory change whose own write failed and is being undone.
//
// The token is not a record but the source of a bind mount:
// state_dir/podmgmt/<sandbox>/token, mounted read-only into the declared
// container. Its path is fixed: the restart state replays the kubelet's
// CreateContainer requests (with the mount) of running pods, also after an
// upgrade. A step whose record or token could not be written is not carried
// out.

const (
	recordBucket = "podmgmt"
	stateBucket  = "podmgmt-state"
)

func (m *Manager) tokenDir(sandbox string) string { return filepath.Join(m.dir, sandbox) }
func (m *Manager) tokenPath(sandbox string) string {
	return filepath.Join(m.tokenDir(sandbox), "token")
}

// openRecords opens the store's buckets of pod records and channel states.
func (m *Manager) openRecords(st *store.Store) error {
	var err error
	if m.records, err = st.Bucket(recordBucket); err != nil {
		return err
	}
	m.states, err = st.Bucket(stateBucket)
	return err
}

// loadAll reads every pod record; an unusable one is dropped with whatever
// else the pod left (its token directory). Token directories without a
// record (left by a crash in create or removeRecord) are removed.
func (m *Manager) loadAll() error {
	keys, err := m.records.List()
	if err != nil {
		return err
	}
	for _, sb := range keys {
		p, err := m.load(sb)
		if err != nil {
			m.log.Warn("podmgmt: dropping an unreadable pod record", "sandbox", sb, "err", err)
			if err := m.removeRecord(sb); err != nil {
				m.log.Warn("podmgmt: removing an unreadable pod record", "sandbox", sb, "err", err)
			}
			continue
		}
		m.pods[p.SandboxID] = p
		for id, code := range p.Overrides {
			m.exitCodes[id] = code
		}
	}
	ents, _ := os.ReadDir(m.dir)
	for _, e := range ents {
		if m.pods[e.Name()] == nil && store.CheckKey(e.Name()) == nil {
			if err := m.removeRecord(e.Name()); err != nil {
				m.log.Warn("podmgmt: removing the token of a pod without a record", "sandbox", e.Name(), "err", err)
			}
		}
	}
	return nil
}

func (m *Manager) load(sandbox string) (*pod, error) {
	p := &pod{}
	if err := m.records.GetJSON(sandbox, p); err != nil {
		return nil, err
	}
	if p.SandboxID != sandbox {
		return nil, fmt.Errorf("record names sandbox %q", p.SandboxID)
	}
	tok, err := os.ReadFile(m.tokenPath(sandbox))
	if err != nil {
		return nil, err
	}
	p.token = string(tok)
	p.init()
	p.terminating.Store(p.Terminating)
	return p, nil
}

// save writes the pod record durably. Writes of one pod are ordered by its
// save lock; the manager's lock is held only to copy the record, never
// across the fsync.
func (m *Manager) save(p *pod) error {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	if p.gone {
		return fmt.Errorf("podmgmt: sandbox %s was removed", p.SandboxID)
	}
	m.mu.Lock()
	b, err := json.Marshal(p)
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("podmgmt: encoding the record of %s: %w", p.SandboxID, err)
	}
	if err := m.records.Put(p.SandboxID, b); err != nil {
		m.log.Error("podmgmt: writing pod record; the step it records is not carried out", "sandbox", p.SandboxID, "err", err)
		return err
	}
	return nil
}

// create makes a new pod's token and record. A failure removes what it
// wrote.
func (m *Manager) create(p *pod) (err error) {
	if err := store.CheckKey(p.SandboxID); err != nil {
		return fmt.Errorf("sandbox id: %w", err)
	}
	defer func() {
		if err != nil {
			_ = m.removeRecord(p.SandboxID)
		}
	}()
	if err := os.Mkdir(m.tokenDir(p.SandboxID), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %w", statefile.ErrNotDurable, err)
	}
	if err := statefile.SyncDir(m.dir); err != nil {
		return fmt.Errorf("%w: %s: %w", statefile.ErrNotDurable, m.dir, err)
	}
	// The file is bind-mounted read-only into the declared container, whose
	// user may not be root; it is created with that mode before a byte of
	// the token is in it.
	if err := statefile.WriteFile(m.tokenPath(p.SandboxID), []byte(p.token), 0o444); err != nil {
		return err
	}
	return m.save(p)
}

// forgetRecord deletes a removed pod's records; no write of them happens
// afterwards.
func (m *Manager) forgetRecord(p *pod) error {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	p.gone = true
	return m.removeRecord(p.SandboxID)
}

// removeRecord deletes a pod's records and token durably. An ID that cannot
// name a record has none.
func (m *Manager) removeRecord(sandbox string) error {
	if store.CheckKey(sandbox) != nil {
		return nil
	}
	errs := []error{m.records.Remove(sandbox), m.states.Remove(sandbox)}
	dir := m.tokenDir(sandbox)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errors.Join(errs...)
	}
	for _, e := range ents {
		errs = append(errs, statefile.Remove(filepath.Join(dir, e.Name())))
	}
	errs = append(errs, statefile.Remove(dir))
	return errors.Join(errs...)
}

// writeState records the channel's state line for `cri-shim pods`, unless
// it is the state already written.
func (m *Manager) writeState(p *pod, st string) {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	if p.gone || p.written == st {
		return
	}
	line := fmt.Sprintf("%s %s dropped=%d\n", st, time.Now().UTC().Format(time.RFC3339), p.dropped.Load())
	if err := m.states.Put(p.SandboxID, []byte(line)); err != nil {
		m.log.Warn("podmgmt: writing the channel state line", "sandbox", p.SandboxID, "err", err)
		return
	}
	p.written = st
}
