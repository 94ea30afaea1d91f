package capture

// Crash recovery: the records of pods a checkpoint froze, and the output
// directories a killed capture left incomplete.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// frozenRecord is written before the first pause of a checkpoint and removed
// once every container is resumed: a shim killed in between finds it at start
// and resumes them, so no crash leaves a pod frozen.
//
// Frozen records are not per-sandbox records of the state store: there is one
// per call (a later call of a sandbox must not replace the record of an
// earlier one whose resume is pending), and a record must outlive its
// sandbox's removal until its containers are resumed or known gone (the
// resume of a removed container answers NotFound and clears it), so the
// store's Gone must not remove it. They keep statefile's rule in
// stateDir/checkpoint.
type frozenRecord struct {
	SandboxID  string   `json:"sandboxId"`
	Containers []string `json:"containers"`
	OutputPath string   `json:"outputPath"`
	Started    int64    `json:"started"`
}

// frozenPath is the record of one call (sandbox ID and the call's start in
// nanoseconds): a later call of the same sandbox never replaces or removes
// the record of an earlier one whose resume is still pending.
func (s *Service) frozenPath(r frozenRecord) string {
	return filepath.Join(s.cfg.StateDir, "checkpoint", r.SandboxID+"."+strconv.FormatInt(r.Started, 10)+".frozen.json")
}

func (s *Service) writeFrozen(r frozenRecord) error {
	return statefile.WriteJSON(s.frozenPath(r), r, 0o600)
}

// removeRecord deletes a record durably; a failure is logged and counted by
// statefile (the record is then acted on again at the next start, which is
// harmless: resuming a running container is a no-op).
func (s *Service) removeRecord(path string) {
	if err := statefile.Remove(path); err != nil {
		s.log.Error("checkpoint: removing a record", "err", err)
	}
}

// ResumeRecorded resumes every container named by a frozen record left behind
// (by a crash, or by a resume that failed) and removes the records it clears.
// It returns the output directories of the records it could not clear yet.
func (s *Service) ResumeRecorded(ctx context.Context) (pendingOut map[string]bool) {
	pendingOut = map[string]bool{}
	s.mu.Lock()
	gen := s.resumeGen
	s.mu.Unlock()
	dir := filepath.Join(s.cfg.StateDir, "checkpoint")
	ents, err := os.ReadDir(dir)
	if err != nil {
		s.log.Error("checkpoint: reading frozen records", "err", err)
		return pendingOut
	}
	pending := false
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, statefile.TempSuffix) {
			os.Remove(filepath.Join(dir, name))
			continue
		}
		if !strings.HasSuffix(name, ".frozen.json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		var r frozenRecord
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			s.log.Error("checkpoint: unreadable frozen record removed", "file", name, "err", err)
			s.removeRecord(filepath.Join(dir, name))
			continue
		}
		switch s.resumeOne(ctx, filepath.Join(dir, name), r) {
		case recordPending:
			pending, pendingOut[r.OutputPath] = true, true
		case recordWatched:
			pendingOut[r.OutputPath] = true
		}
	}
	s.mu.Lock()
	// A resume that failed while this pass ran (a record it may not have
	// read) keeps the retry going.
	s.pendingResume = pending || s.resumeGen != gen
	s.mu.Unlock()
	return pendingOut
}

// What resumeOne did with a record.
type recordState int

const (
	// recordPending: left for a later pass (its resume failed, or a call
	// or other work holds its sandbox or directory).
	recordPending recordState = iota
	// recordCleared: its containers resumed, the record removed.
	recordCleared
	// recordWatched: containerd still captures; a watcher clears the
	// record as soon as the capture ends.
	recordWatched
)

// resumeOne clears one frozen record: it resumes the record's containers and
// empties the record's output if it is still marked incomplete. It holds the
// record's sandbox and output directory meanwhile, so it never acts on what a
// call running now owns (a record whose sandbox or directory is held waits for
// the next pass), and a directory that a later call has since filled with a
// complete checkpoint is left alone.
//
// A shim killed mid-capture does not stop containerd's capture: CRIU goes on
// with the paused containers and, when it ends, puts the freezer back as it
// found it (frozen), so a resume before then would be undone. A record whose
// capture still runs is handed to a watcher, which keeps holding the sandbox
// and directory, waits for the capture's process to exit and clears the
// record at once; a resume that then fails is retried on the ticker.
func (s *Service) resumeOne(ctx context.Context, path string, r frozenRecord) recordState {
	j := s.tryHold(r.SandboxID, r.OutputPath)
	if j == nil {
		return recordPending
	}
	if id, ok := s.anyCaptureRunning(r.Containers); ok {
		s.log.Info("checkpoint: an interrupted checkpoint's capture is still running in containerd; resuming as soon as it ends", "sandbox", short(r.SandboxID), "container", short(id))
		s.watchRecord(ctx, j, path, r)
		return recordWatched
	}
	defer s.release(j)
	if err := s.clearRecord(ctx, path, r); err != nil {
		s.log.Error("checkpoint: resuming containers of an interrupted checkpoint; will retry", "sandbox", r.SandboxID, "err", err)
		return recordPending
	}
	return recordCleared
}

// watchRecord clears record r (at path) as soon as no capture of its
// containers runs, in the background; j, holding its sandbox and directory,
// is released then. A resume that fails is retried on the ticker; ctx's end
// leaves the record to the next start.
func (s *Service) watchRecord(ctx context.Context, j *job, path string, r frozenRecord) {
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		defer s.release(j)
		if err := s.waitCaptures(ctx, r.Containers); err != nil {
			return
		}
		if err := s.clearRecord(ctx, path, r); err != nil {
			s.resumeFailed(fmt.Errorf("resuming the containers of an interrupted checkpoint of sandbox %s: %w", short(r.SandboxID), err))
		}
	}()
}

// clearRecord resumes a record's containers, empties its output if still
// marked incomplete and removes it. The caller holds its sandbox and
// directory, and no capture of its containers runs.
func (s *Service) clearRecord(ctx context.Context, path string, r frozenRecord) error {
	if err := s.thawAll(ctx, r.Containers); err != nil {
		return err
	}
	if r.OutputPath != "" && marked(r.OutputPath) {
		if err := s.removeOutput(r.OutputPath); err != nil {
			s.log.Warn("checkpoint: removing an interrupted checkpoint's files", "path", r.OutputPath, "err", err)
		}
	}
	s.removeRecord(path)
	s.log.Info("checkpoint: resumed the containers of an interrupted checkpoint", "sandbox", r.SandboxID, "containers", len(r.Containers))
	return nil
}

// marked reports whether dir still carries the incomplete mark: only then is
// what it holds the unfinished checkpoint of the call that marked it.
func marked(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, layout.IncompleteFile))
	return err == nil
}

// thawAll resumes every listed container that is paused, in parallel. A
// container that is not paused (a record may outlive the pause) or no longer
// exists needs nothing.
func (s *Service) thawAll(ctx context.Context, ids []string) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.thaw(ctx, id); err != nil {
				errs[i] = fmt.Errorf("resume %s: %w", short(id), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// thaw resumes container id. The resume is asked first, and whether the
// container is paused only when it fails: the usual resume, while the pod is
// frozen, is one round trip through containerd. A resume of a task that is
// not paused changes nothing (containerd's runc shim refuses it in every
// other state: cmd/containerd-shim-runc-v2/process/init_state.go).
func (s *Service) thaw(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, s.resumeTimeout)
	defer cancel()
	err := s.tasks.Resume(ctx, id)
	if err == nil || isNotFound(err) {
		return nil
	}
	if paused, perr := s.tasks.Paused(ctx, id); perr == nil && !paused || perr != nil && isNotFound(perr) {
		return nil
	}
	return err
}

// CleanIncomplete removes what an interrupted checkpoint wrote under the root:
// any directory still marked incomplete is emptied (the directory itself
// belongs to its caller and stays), but for those in skip, which a record
// still pending owns.
func (s *Service) CleanIncomplete(skip map[string]bool) {
	ents, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		s.log.Error("checkpoint: reading the checkpoint root", "root", s.cfg.Root, "err", err)
		return
	}
	for _, e := range ents {
		// Names beginning with a dot are the shim's own working
		// directories, never a checkpoint (layout.CheckName): pulls in
		// progress, pulled checkpoints being deleted, staged restores.
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(s.cfg.Root, e.Name())
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue
		}
		if skip[real] || skip[dir] || !marked(real) {
			continue
		}
		// A call that started meanwhile (the socket serves while this runs)
		// owns its directory: leave it.
		j := s.tryHold("", real)
		if j == nil {
			continue
		}
		err = s.removeOutput(real)
		s.release(j)
		if err != nil {
			s.log.Warn("checkpoint: removing an interrupted checkpoint's files", "path", dir, "err", err)
			continue
		}
		s.log.Info("checkpoint: removed the files of an interrupted checkpoint", "path", dir)
	}
}

// removeOutput empties a checkpoint directory, keeping the directory.
func (s *Service) removeOutput(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
