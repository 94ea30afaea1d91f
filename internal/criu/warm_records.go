package criu

// The warm-start records: one per warm-started sandbox in the state store,
// reloaded and checked again by a restarted shim, removed with their
// sandboxes and swept when the runtime no longer lists them.

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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
		if err == nil {
			w.Dir, w.m, err = s.openCheckpoint(w.Dir, w.Namespace)
		}
		if err != nil {
			s.log.Error("checkpoint: dropping a warm-start record that cannot be used", "sandbox", id, "err", err)
			s.removeWarmRecord(id)
			continue
		}
		if w.Done == nil {
			w.Done = map[string]bool{}
		}
		s.warm[w.SandboxID] = &w
	}
	s.countHooked()
	return nil
}

// forgetWarm drops the warm-start record of a sandbox, if it has one: the
// service's subscriber to the state store's lifecycle.
func (s *Service) forgetWarm(id string) {
	s.mu.Lock()
	w, ok := s.warm[id]
	delete(s.warm, id)
	release := s.forgetWarmRestart(id)
	s.countHooked()
	s.mu.Unlock()
	for _, r := range release {
		r()
	}
	s.unstageSandbox(id)
	if ok {
		s.removeWarmRecord(id)
		s.releasePulled(w.Dir)
	}
}

// removeWarmRecord deletes a warm-start record durably; a failure is logged
// and counted by statefile (the sandbox's Gone, or a sweep, tries again).
func (s *Service) removeWarmRecord(id string) {
	if err := s.warmRecs.Remove(id); err != nil {
		s.log.Error("checkpoint: removing a warm-start record", "sandbox", id, "err", err)
	}
}

// warmSweepEvery is how often SweepWarm compares the warm-start records with
// the runtime's sandboxes; warmSweepRetry how soon it tries again when the
// runtime did not answer.
var warmSweepEvery, warmSweepRetry = 5 * time.Minute, 10 * time.Second

// SweepWarm keeps the warm-start records bounded by the sandboxes that exist:
// at start (sandboxes removed while the shim was down) and then periodically
// (sandboxes removed behind the shim's back, straight on the runtime), every
// record whose sandbox the runtime no longer lists is removed. It returns
// when ctx ends.
func (s *Service) SweepWarm(ctx context.Context) {
	for {
		wait := warmSweepEvery
		s.sweepPulled()
		if err := s.sweepWarm(ctx); err != nil {
			s.log.Warn("checkpoint: listing sandboxes to clean warm-start records; will retry", "err", err)
			wait = warmSweepRetry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// sweepWarm removes the records of sandboxes the runtime does not list. Only
// records that existed before the list was asked for are candidates: a
// sandbox created meanwhile may be missing from the answer.
func (s *Service) sweepWarm(ctx context.Context) error {
	s.mu.Lock()
	if len(s.warm) == 0 {
		s.mu.Unlock()
		return nil
	}
	ids := make([]string, 0, len(s.warm))
	for id := range s.warm {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lr, err := s.rt.ListPodSandbox(lctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	live := make(map[string]bool, len(lr.GetItems()))
	for _, sb := range lr.GetItems() {
		live[sb.GetId()] = true
	}
	for _, id := range ids {
		if !live[id] {
			// Announced to every feature: none keeps records of it.
			if err := s.cfg.Store.Gone(id); err != nil {
				s.log.Warn("checkpoint: removing the records of a sandbox that no longer exists", "sandbox", short(id), "err", err)
			}
			s.log.Info("checkpoint: removed the warm-start record of a sandbox that no longer exists", "sandbox", short(id))
		}
	}
	return nil
}
