package podmgmt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// A pod's record is a directory state_dir/podmgmt/<sandbox> holding pod.json
// (the pod, its declaration, the exit codes the orchestrator asked for, whether
// the sandbox is being stopped), token (bind-mounted into the orchestrator)
// and state (what `cri-shim pods` shows). Every file is written with
// statefile's rule (temp, fsync, rename, fsync dir); a step whose record could
// not be written is not carried out.

func (m *Manager) podDir(sandbox string) string { return filepath.Join(m.dir, sandbox) }
func (m *Manager) tokenPath(sandbox string) string {
	return filepath.Join(m.podDir(sandbox), "token")
}

// validSandboxID refuses IDs that are not one path element (the runtime's
// IDs are hex; anything else must never name a path).
func validSandboxID(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00") || strings.HasPrefix(id, ".") {
		return fmt.Errorf("sandbox id %q is not usable as a file name", id)
	}
	return nil
}

func (m *Manager) load(sandbox string) (*pod, error) {
	b, err := os.ReadFile(filepath.Join(m.podDir(sandbox), "pod.json"))
	if err != nil {
		return nil, err
	}
	p := &pod{}
	if err := json.Unmarshal(b, p); err != nil {
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
	if err := statefile.WriteFile(filepath.Join(m.podDir(p.SandboxID), "pod.json"), b, 0o600); err != nil {
		m.log.Error("podmgmt: writing pod record; the step it records is not carried out", "sandbox", p.SandboxID, "err", err)
		return err
	}
	return nil
}

// create makes a new pod's directory, token and record. A failure removes
// what it wrote.
func (m *Manager) create(p *pod) (err error) {
	if err := validSandboxID(p.SandboxID); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = m.removeRecord(p.SandboxID)
		}
	}()
	if err := os.Mkdir(m.podDir(p.SandboxID), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
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

// forgetRecord deletes a removed pod's record; no write of it happens afterwards.
func (m *Manager) forgetRecord(p *pod) error {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	p.gone = true
	return m.removeRecord(p.SandboxID)
}

// removeRecord deletes a pod's directory durably.
func (m *Manager) removeRecord(sandbox string) error {
	if err := validSandboxID(sandbox); err != nil {
		return err
	}
	dir := m.podDir(sandbox)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
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
	if err := statefile.WriteFile(filepath.Join(m.podDir(p.SandboxID), "state"), []byte(line), 0o600); err != nil {
		m.log.Warn("podmgmt: writing the channel state line", "sandbox", p.SandboxID, "err", err)
		return
	}
	p.written = st
}
