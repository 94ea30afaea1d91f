package warm

// The warm-start records: one per warm-started sandbox in the state store,
// reloaded and checked again by a restarted shim, removed with their
// sandboxes and swept when the runtime no longer lists them.

import (
	"fmt"

	"github.com/cri-shim/cri-shim/internal/criucheck"
)

// warmBucket is the state store's bucket of warm-start records, one per
// sandbox (key: its ID).
const warmBucket = "warm"

func (s *Service) saveWarm(w *warmPod) error {
	return s.warmRecs.PutJSON(w.SandboxID, w)
}

// loadWarm reads the warm starts an earlier shim left in progress. Each is
// checked again as when it began (confined, namespace binding under the
// current configuration, archives): one that no longer passes is dropped, and
// its pod's next containers start fresh. A record without a namespace (written
// before the binding existed) passes only for a checkpoint without one.
func (s *Service) loadWarm() error {
	b, err := s.cfg.Store.Bucket(warmBucket)
	if err != nil {
		return err
	}
	s.warmRecs = b
	keys, err := b.List()
	if err != nil {
		return err
	}
	for _, id := range keys {
		var w warmPod
		err := b.GetJSON(id, &w)
		if err == nil && w.SandboxID != id {
			err = fmt.Errorf("record of sandbox %q in the file of another", w.SandboxID)
		}
		if err == nil && w.Refused == "" {
			w.Dir, w.m, err = s.restore.Open(w.Dir, w.Namespace)
		}
		if err != nil {
			s.log.Error("checkpoint: dropping a warm-start record that cannot be used", "sandbox", id, "err", err)
			s.removeWarmRecord(id)
			continue
		}
		if w.Done == nil {
			w.Done = map[string]bool{}
		}
		w.release = func() {}
		if w.Refused == "" {
			w.release = s.ckpts.Use(w.Dir)
		}
		s.warm[w.SandboxID] = &w
	}
	s.countHooked()
	return nil
}

// SandboxGone drops the warm-start record of a sandbox, if it has one (the
// state store's lifecycle: the server's feature list subscribes it).
func (s *Service) SandboxGone(id string) {
	s.mu.Lock()
	w, ok := s.warm[id]
	delete(s.warm, id)
	release := s.forgetWarmRestart(id)
	s.countHooked()
	s.mu.Unlock()
	for _, r := range release {
		r()
	}
	if ok {
		s.removeWarmRecord(id)
		w.release()
		s.ckpts.ReleasePulled(w.Dir)
	}
}

// refuseWarm records that the image check refused the checkpoint of
// sandbox's warm start for its container name, and removes a pulled
// checkpoint no other warm start reads. Unrecorded (the store failing), the
// refusal is only in memory: a restarted shim checks the checkpoint again
// and refuses it again.
func (s *Service) refuseWarm(sandbox, name string, r *criucheck.Refusal) {
	s.mu.Lock()
	w := s.warm[sandbox]
	if w == nil || w.Refused != "" {
		s.mu.Unlock()
		return
	}
	w.Refused = fmt.Sprintf("container %s: %v", name, r)
	err := s.saveWarm(w)
	s.mu.Unlock()
	if err != nil {
		s.log.Error("checkpoint: recording a refused warm start", "sandbox", sandbox, "err", err)
	}
	s.log.Warn("checkpoint: warm start refused; the pod creates no more containers", "sandbox", sandbox, "checkpoint", w.Checkpoint, "reason", w.Refused)
	w.release()
	s.ckpts.ReleasePulled(w.Dir)
}

// removeWarmRecord deletes a warm-start record durably; a failure is logged
// and counted by statefile (the sandbox's Gone, or the pod table's relist,
// tries again).
func (s *Service) removeWarmRecord(id string) {
	if err := s.warmRecs.Remove(id); err != nil {
		s.log.Error("checkpoint: removing a warm-start record", "sandbox", id, "err", err)
	}
}
