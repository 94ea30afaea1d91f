package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// capture pauses every target, captures each, and resumes all, whatever
// happens. On any failure the output directory is emptied.
func (s *Service) capture(ctx context.Context, j *job, targets []target, opts checkpointOptions, m *layout.Manifest) error {
	out, sandboxID := j.out, j.sandbox
	// The mark first: a shim killed after it finds every later file under
	// a marked directory, which the next start empties.
	if err := layout.WriteFileSync(filepath.Join(out, layout.IncompleteFile), nil); err != nil {
		_ = s.removeOutput(out)
		return errorf(errdefs.ErrUnavailable, "CheckpointPod: marking the checkpoint incomplete: %v; nothing was paused", err)
	}
	if err := statefile.SyncDir(out); err != nil {
		_ = s.removeOutput(out)
		return errorf(errdefs.ErrUnavailable, "CheckpointPod: marking the checkpoint incomplete: %v; nothing was paused", err)
	}
	if err := os.Mkdir(filepath.Join(out, layout.ContainersDir), 0o700); err != nil {
		_ = s.removeOutput(out)
		return errorf(errdefs.ErrInternal, "CheckpointPod: %v", err)
	}
	ids := make([]string, len(targets))
	for i, t := range targets {
		ids[i] = t.id
	}
	rec := frozenRecord{SandboxID: sandboxID, Containers: ids, OutputPath: out, Started: s.now().UnixNano()}
	j.rec = rec
	if err := s.writeFrozen(rec); err != nil {
		_ = s.removeOutput(out)
		// Without the record a kill -9 while paused would leave the pod
		// frozen: nothing is paused, and the kubelet may retry.
		return errorf(errdefs.ErrUnavailable, "CheckpointPod: recording the pause: %v; nothing was paused", err)
	}
	fail := func(err error) error {
		_ = s.removeOutput(out)
		s.removeRecord(s.frozenPath(rec))
		return err
	}

	// The call must return with every container resumed before the caller's
	// own deadline fires, so the service gives up a margin earlier: the time
	// resuming them takes. A deadline too short to pause and resume is refused
	// before anything is paused.
	deadline, _ := ctx.Deadline()
	margin := s.resumeMargin(len(targets))
	if time.Until(deadline) < 2*margin {
		return fail(errorf(context.DeadlineExceeded, "CheckpointPod: %s left of the deadline is too little to pause, capture and resume %d containers; nothing was paused",
			time.Until(deadline).Round(time.Millisecond), len(targets)))
	}
	giveUp := time.NewTimer(time.Until(deadline) - margin)
	defer giveUp.Stop()

	// Pause every container before capturing any: one pod-wide cut.
	pausedAt := s.now()
	i, err := s.pauseAll(ctx, targets)
	allPaused := s.now()
	if err != nil {
		t := targets[i]
		if rerr := s.thawAll(context.WithoutCancel(ctx), ids); rerr != nil {
			s.resumeFailed(rerr)
			return errorf(errdefs.ErrInternal, "CheckpointPod: pausing %s (%s): %v; and resuming the others failed, cri-shim retries: %v", short(t.id), t.name, err, rerr)
		}
		return fail(errorf(errdefs.ErrInternal, "CheckpointPod: pausing container %s (%s): %v", short(t.id), t.name, err))
	}

	// Captures run under a context of their own: containerd goes on with a
	// capture after its caller gives up, and the service must know when it
	// ends to resume and clean up after it.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.dumpTimeout)
	errs := make([]error, len(targets))
	took := make([]time.Duration, len(targets))
	times := make([]layout.CaptureTimes, len(targets))
	// What each capture left open (its archive as streamed, its log at the
	// cut): packageOne finishes it, or whoever gives up abandons it.
	caps := make([]*captured, len(targets))
	abandonCaptures := func() {
		for _, c := range caps {
			if c != nil {
				c.abandon()
			}
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	dump := func(i int) {
		t0 := s.now()
		c, err := s.captureOne(dctx, out, targets[i], &times[i])
		took[i], errs[i], caps[i] = s.now().Sub(t0), err, c
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if opts.sequential {
			for i := range targets {
				if time.Until(deadline) < margin { // the deadline stops further captures
					errs[i] = context.DeadlineExceeded
					continue
				}
				dump(i)
			}
			return
		}
		var each sync.WaitGroup
		for i := range targets {
			each.Add(1)
			go func() { defer each.Done(); dump(i) }()
		}
		each.Wait()
	}()
	go func() { wg.Wait(); close(done) }()

	select {
	case <-done:
		timedOut := dctx.Err() != nil
		cancel()
		if _, running := s.anyCaptureRunning(ids); timedOut && running {
			abandonCaptures()
			// dumpTimeout ended the wait, not containerd's capture: it
			// would freeze the pod again when it ends. The record stays;
			// a watcher, holding the job, resumes the containers and
			// empties the output as soon as it has ended.
			s.handOver(j)
			s.watchRecord(context.WithoutCancel(ctx), j, s.frozenPath(rec), rec)
			return errorf(context.DeadlineExceeded, "CheckpointPod: containerd's capture did not end within %s; cri-shim resumes every container as soon as it ends", s.dumpTimeout)
		}
	case <-giveUp.C:
		// Deadline: resume now, return, and finish cleaning up once
		// containerd's captures end (a capture still running could write
		// its archive or, by restoring the freezer state it found, freeze a
		// container again).
		// containerd serializes a resume behind a capture in progress (CRIU
		// holds the processes until it detaches), so the resume may not
		// finish before the deadline; then afterAbandoned resumes them.
		tctx, tcancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(-margin/4))
		rerr := s.thawAll(tctx, ids)
		tcancel()
		_ = s.removeOutput(out)
		// The leftover work holds the job until it ends, so that it never
		// touches what a later call of this sandbox or directory owns.
		s.handOver(j)
		s.inflight.Add(1)
		go func() {
			defer s.inflight.Done()
			defer s.release(j)
			<-done
			cancel()
			abandonCaptures()
			s.afterAbandoned(rec)
		}()
		msg := fmt.Sprintf("CheckpointPod: deadline reached %s after the pause while capturing %d containers; the capture was abandoned and its files removed", s.now().Sub(pausedAt).Round(time.Millisecond), len(targets))
		if rerr != nil {
			msg += "; containerd is still capturing (CRIU holds the processes), and cri-shim resumes every container as soon as that capture ends"
		} else {
			msg += "; every container was resumed"
		}
		return errorf(context.DeadlineExceeded, "%s", msg)
	}

	captured := s.now()
	rerr := s.thawAll(context.WithoutCancel(ctx), ids)
	resumed := s.now()
	s.recordFreeze(m, pausedAt, allPaused, captured, resumed)
	for i, err := range errs {
		if err != nil {
			abandonCaptures()
			msg := fmt.Sprintf("CheckpointPod: capturing container %s (%s): %v", short(targets[i].id), targets[i].name, message(err))
			kind := runtimeKind(err)
			if rerr != nil {
				s.resumeFailed(rerr)
				_ = s.removeOutput(out)
				return errorf(kind, "%s; resuming failed, cri-shim retries: %v", msg, rerr)
			}
			return fail(errorf(kind, "%s; every container was resumed and the partial checkpoint removed", msg))
		}
	}
	if rerr != nil {
		abandonCaptures()
		s.resumeFailed(rerr)
		_ = s.removeOutput(out)
		return errorf(errdefs.ErrInternal, "CheckpointPod: resuming after the capture failed, cri-shim retries: %v", rerr)
	}
	// The pod runs again: CRIU's own account of each capture, then the
	// archives, in parallel.
	for i, t := range targets {
		s.addCRIUStats(&times[i], out, t)
		s.log.Debug("checkpoint: container captured", "container", short(t.id), "name", t.name, "seconds", took[i].Seconds(),
			"checkpointSeconds", times[i].CheckpointSeconds, "diffSeconds", times[i].DiffSeconds, "criuFrozenSeconds", times[i].CRIUFrozenSeconds,
			"criuMemdumpSeconds", times[i].CRIUMemdumpSeconds, "criuMemwriteSeconds", times[i].CRIUMemwriteSeconds, "criuPagesWritten", times[i].CRIUPagesWritten)
	}
	sizes := make([]int64, len(targets))
	perrs := make([]error, len(targets))
	cut := s.now().UTC()
	imageIDs := make([]string, len(targets))
	for i, t := range targets {
		if imageIDs[i] = t.status.GetImageId(); imageIDs[i] == "" {
			imageIDs[i] = ImageID(ctx, s.img, t.status.GetImageRef())
		}
	}
	var pw sync.WaitGroup
	for i := range targets {
		pw.Add(1)
		go func() {
			defer pw.Done()
			sizes[i], perrs[i] = s.packageOne(ctx, out, targets[i], imageIDs[i], cut, caps[i])
		}()
	}
	pw.Wait()
	for i, t := range targets {
		if perrs[i] != nil {
			var kind error = errdefs.ErrInternal
			if ctx.Err() != nil {
				kind = context.DeadlineExceeded
			}
			return fail(errorf(kind, "CheckpointPod: writing the archive of container %s (%s): %v; the pod runs, the partial checkpoint was removed", short(t.id), t.name, perrs[i]))
		}
		st, imageID := t.status, imageIDs[i]
		m.Containers = append(m.Containers, layout.ContainerEntry{
			Name: t.name, ID: t.id, Archive: layout.ArchiveName(t.name),
			Image: st.GetImage().GetImage(), ImageRef: st.GetImageRef(), ImageID: imageID,
			RestartCount: RestartCount(st.GetAnnotations()), Attempt: st.GetMetadata().GetAttempt(),
			SizeBytes: sizes[i], DumpSeconds: took[i].Seconds(), Capture: &times[i],
		})
		m.SizeBytes += sizes[i]
	}
	return nil
}

// recordFreeze puts the freeze and its spans (from the first pause to
// every container paused, captured, resumed) in the manifest, the metrics and
// the debug log.
func (s *Service) recordFreeze(m *layout.Manifest, pausedAt, allPaused, captured, resumed time.Time) {
	frozen := resumed.Sub(pausedAt)
	m.FrozenSeconds = frozen.Seconds()
	m.Freeze = &layout.FreezeTimes{PauseSeconds: allPaused.Sub(pausedAt).Seconds(), CaptureSeconds: captured.Sub(allPaused).Seconds(),
		ResumeSeconds: resumed.Sub(captured).Seconds()}
	s.metrics.frozen.Observe(frozen.Seconds())
	s.metrics.freezePhase.WithLabelValues("pause").Observe(m.Freeze.PauseSeconds)
	s.metrics.freezePhase.WithLabelValues("capture").Observe(m.Freeze.CaptureSeconds)
	s.metrics.freezePhase.WithLabelValues("resume").Observe(m.Freeze.ResumeSeconds)
	s.log.Debug("checkpoint: pod resumed", "sandbox", short(m.Pod.SandboxID), "frozenSeconds", m.FrozenSeconds,
		"pauseSeconds", m.Freeze.PauseSeconds, "captureSeconds", m.Freeze.CaptureSeconds, "resumeSeconds", m.Freeze.ResumeSeconds)
}

// addCRIUStats adds CRIU's statistics of target t's capture into out to tm;
// a capture without them (a CRIU that wrote none) keeps zeros.
func (s *Service) addCRIUStats(tm *layout.CaptureTimes, out string, t target) {
	st, err := dumpStats(workDir(out, t.name))
	if err != nil {
		s.log.Debug("checkpoint: CRIU's dump statistics", "container", short(t.id), "err", err)
		return
	}
	const us = 1e-6 // CRIU counts its times in microseconds (criu/stats.c)
	tm.CRIUFrozenSeconds = float64(st.GetFrozenTime()) * us
	tm.CRIUMemdumpSeconds = float64(st.GetMemdumpTime()) * us
	tm.CRIUMemwriteSeconds = float64(st.GetMemwriteTime()) * us
	tm.CRIUPagesWritten = st.GetPagesWritten()
}

// pauseAll pauses every target at once (each through its own runc call) and,
// once all have answered, returns the first failure in target order. The
// captures start only after it returns, so the cut stays pod-wide; pausing
// in parallel only shortens the time the first container waits for the last.
func (s *Service) pauseAll(ctx context.Context, targets []target) (int, error) {
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.pauseOne(ctx, t.id) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return i, err
		}
	}
	return -1, nil
}

// freezeRetries are the waits before each new try of a pause that runc
// could not complete. On cgroup v1 runc gives up with "unable to freeze"
// when the cgroup stays FREEZING through its thousand tries (a task in an
// uninterruptible sleep, or forking, holds it there), and it thaws the
// cgroup before answering (opencontainers/cgroups fs/freezer.go), so a new
// try starts from a running container. The other targets stay paused
// meanwhile: the cut is still taken only once every target is paused.
var freezeRetries = []time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond}

// pauseOne pauses container id, trying again while runc reports a freeze
// that did not complete.
func (s *Service) pauseOne(ctx context.Context, id string) error {
	err := s.tasks.Pause(ctx, id)
	for _, wait := range freezeRetries {
		if err == nil || !strings.Contains(err.Error(), "unable to freeze") {
			return err
		}
		s.log.Info("checkpoint: runc could not freeze the container; trying again", "container", short(id), "after", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		err = s.tasks.Pause(ctx, id)
	}
	return err
}

// resumeMargin is how long before the caller's deadline the service stops
// waiting for captures: enough to resume n containers (containerd's resume
// through runc takes tens of milliseconds each) and answer.
func (s *Service) resumeMargin(n int) time.Duration {
	return s.marginBase + time.Duration(n)*s.marginPer
}

// resumeFailed leaves the frozen record in place and has Run retry it.
func (s *Service) resumeFailed(err error) {
	s.log.Error("checkpoint: resuming paused containers failed; retrying in the background", "err", err)
	s.mu.Lock()
	s.pendingResume = true
	s.resumeGen++
	s.mu.Unlock()
}

// afterAbandoned runs once containerd's captures of an abandoned checkpoint
// have ended: each container is paused and resumed again (a capture that
// ended after the first resume may have restored the freezer state it had
// found, frozen), the files the captures wrote are removed, and the frozen
// record with them.
func (s *Service) afterAbandoned(rec frozenRecord) {
	ctx := context.Background()
	// The wait for the captures may have ended at dumpTimeout while runc
	// still captures: a resume before it ends would be undone. A capture
	// still running after an hour more is not waited for.
	wctx, wcancel := context.WithTimeout(ctx, time.Hour)
	if err := s.waitCaptures(wctx, rec.Containers); err != nil {
		s.log.Warn("checkpoint: an abandoned capture still runs in containerd after an hour; resuming its containers anyway", "sandbox", short(rec.SandboxID))
	}
	wcancel()
	var errs []error
	for _, id := range rec.Containers {
		pctx, cancel := context.WithTimeout(ctx, s.resumeTimeout)
		if err := s.tasks.Pause(pctx, id); err != nil && !isNotFound(err) {
			s.log.Debug("checkpoint: re-pause after an abandoned capture", "container", short(id), "err", err)
		}
		cancel()
		if err := s.thaw(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	_ = s.removeOutput(rec.OutputPath)
	if err := errors.Join(errs...); err != nil {
		s.resumeFailed(err)
		return
	}
	s.removeRecord(s.frozenPath(rec))
	s.log.Info("checkpoint: abandoned capture ended; containers resumed and its files removed", "sandbox", short(rec.SandboxID))
}
