package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

const restartCountAnnotation = "io.kubernetes.container.restartCount"

// CheckpointPod serves the CRI call (KEP-5823): one consistent cut of the
// selected containers of a pod, written under req.OutputPath.
func (s *Service) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	start := s.now()
	m, err := s.checkpointPod(ctx, req)
	if err != nil {
		s.metrics.checkpoints.WithLabelValues(status.Code(err).String()).Inc()
		s.log.Warn("checkpoint: CheckpointPod failed", "sandbox", req.GetPodSandboxId(), "path", req.GetOutputPath(), "err", err)
		return nil, err
	}
	d := s.now().Sub(start)
	s.metrics.checkpoints.WithLabelValues("success").Inc()
	s.metrics.checkpointTime.Observe(d.Seconds())
	s.metrics.checkpointSize.Observe(float64(m.SizeBytes))
	s.log.Info("checkpoint: pod checkpointed", "pod", m.Pod.Namespace+"/"+m.Pod.Name, "path", req.GetOutputPath(),
		"containers", len(m.Containers), "bytes", m.SizeBytes, "seconds", d.Seconds(), "frozenSeconds", m.FrozenSeconds)
	return &runtimeapi.CheckpointPodResponse{}, nil
}

// target is one container to capture.
type target struct {
	id      string
	name    string
	created int64
	status  *runtimeapi.ContainerStatus
	info    ContainerInfo
}

func (s *Service) checkpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*Manifest, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, status.Error(codes.InvalidArgument, "CheckpointPod: the call has no deadline; the CRI contract requires one")
	}
	opts, err := parseCheckpointOptions(req.GetOptions())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "CheckpointPod: "+err.Error())
	}
	sandboxID := req.GetPodSandboxId()
	if sandboxID == "" {
		return nil, status.Error(codes.InvalidArgument, "CheckpointPod: pod_sandbox_id is empty")
	}
	ids := req.GetContainerIds()
	if len(ids) == 0 {
		return nil, status.Error(codes.InvalidArgument, "CheckpointPod: container_ids is empty; name the running containers to capture")
	}
	for i, id := range ids {
		if id == "" {
			return nil, status.Errorf(codes.InvalidArgument, "CheckpointPod: container_ids[%d] is empty", i)
		}
		if slices.Index(ids, id) != i {
			return nil, status.Errorf(codes.InvalidArgument, "CheckpointPod: container %q is listed twice", id)
		}
	}
	out, err := s.outputDir(req.GetOutputPath())
	if err != nil {
		return nil, err
	}

	sb, err := s.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID, Verbose: true})
	if err != nil {
		return nil, err // NotFound and the runtime's other codes pass through
	}
	if st := sb.GetStatus().GetState(); st != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "CheckpointPod: sandbox %s is %s, not ready", short(sandboxID), st)
	}
	sandboxID = sb.GetStatus().GetId() // the runtime accepts a unique prefix; use the full ID from here on
	j, err := s.claim(ctx, sandboxID, out, s.resumeMargin(len(ids)))
	if err != nil {
		return nil, err
	}
	defer func() {
		if !j.returned { // else leftover work holds the job and releases it
			s.release(j)
		}
	}()
	if err := checkEmpty(out, req.GetOutputPath()); err != nil {
		return nil, err
	}

	targets, exited, err := s.selectTargets(ctx, sandboxID, ids)
	if err != nil {
		return nil, err
	}
	if sb.GetStatus().GetLinux().GetNamespaces().GetOptions().GetPid() == runtimeapi.NamespaceMode_POD && len(targets) > 1 {
		// containerd restores container by container: the first restored
		// container's new children take PIDs the next one must get back, and
		// CRIU fails ("Can't fork for N: File exists"). Seen on this stack.
		return nil, status.Errorf(codes.FailedPrecondition, "CheckpointPod: sandbox %s shares one PID namespace between its containers (shareProcessNamespace); "+
			"cri-shim cannot restore several containers of such a pod reliably, so it does not checkpoint them together (checkpoint one container at a time)", short(sandboxID))
	}

	ver, _ := s.rt.Version(ctx, &runtimeapi.VersionRequest{})
	md := sb.GetStatus().GetMetadata()
	m := &Manifest{
		FormatVersion: FormatVersion,
		Pod: PodInfo{Name: md.GetName(), Namespace: md.GetNamespace(), UID: md.GetUid(), SandboxID: sandboxID,
			RuntimeHandler: sb.GetStatus().GetRuntimeHandler()},
		Exited:      exited,
		Managed:     opts.managed,
		Runtime:     ver.GetRuntimeName() + " " + ver.GetRuntimeVersion(),
		CRIUVersion: s.criuVersion(),
		Kernel:      kernelRelease(),
	}
	start := s.now()
	if err := s.capture(ctx, j, targets, opts, m); err != nil {
		return nil, err
	}
	m.TotalSeconds = s.now().Sub(start).Seconds()
	err = s.finish(out, sb, m)
	s.removeRecord(s.frozenPath(j.rec)) // every container runs again
	if err != nil {
		_ = s.removeOutput(out)
		return nil, status.Errorf(codes.Internal, "CheckpointPod: writing the checkpoint's manifest: %v (partial checkpoint removed)", err)
	}
	if opts.managed {
		s.retain(out)
	}
	return m, nil
}

// outputDir checks output_path: absolute, inside the root after symlinks, an
// existing directory. checkEmpty checks it is empty once the call owns it.
func (s *Service) outputDir(p string) (string, error) {
	out, err := confine(s.cfg.Root, p)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "CheckpointPod: output_path: %v", err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "CheckpointPod: output_path: %v", err)
	}
	if !fi.IsDir() {
		return "", status.Errorf(codes.InvalidArgument, "CheckpointPod: output_path %q is not a directory", p)
	}
	return out, nil
}

func checkEmpty(out, p string) error {
	ents, err := os.ReadDir(out)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "CheckpointPod: output_path: %v", err)
	}
	if len(ents) > 0 {
		return status.Errorf(codes.FailedPrecondition, "CheckpointPod: output_path %q is not empty (%d entries, first %q)", p, len(ents), ents[0].Name())
	}
	return nil
}

// selectTargets checks that every requested container is a running container
// of the sandbox, and collects the pod's exited containers (completed init
// containers) for the manifest.
func (s *Service) selectTargets(ctx context.Context, sandboxID string, ids []string) ([]target, []ExitedEntry, error) {
	lr, err := s.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandboxID}})
	if err != nil {
		return nil, nil, err
	}
	byID := make(map[string]*runtimeapi.Container, len(lr.GetContainers()))
	for _, c := range lr.GetContainers() {
		byID[c.GetId()] = c
	}
	var targets []target
	names := map[string]bool{}
	for _, id := range ids {
		c := byID[id]
		if c == nil {
			return nil, nil, status.Errorf(codes.InvalidArgument, "CheckpointPod: container %q is not a container of sandbox %s", id, short(sandboxID))
		}
		name := c.GetMetadata().GetName()
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			return nil, nil, status.Errorf(codes.FailedPrecondition, "CheckpointPod: container %s (%s) is %s; only running containers can be checkpointed", short(id), name, c.GetState())
		}
		if err := CheckContainerName(name); err != nil {
			return nil, nil, status.Errorf(codes.InvalidArgument, "CheckpointPod: container %s: %v", short(id), err)
		}
		if names[name] {
			return nil, nil, status.Errorf(codes.InvalidArgument, "CheckpointPod: two selected containers are named %q", name)
		}
		names[name] = true
		st, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return nil, nil, err
		}
		if len(st.GetStatus().GetAnnotations()) == 0 {
			// containerd 2.2 dereferences the captured container's annotations
			// on restore and panics on a nil map (NODE-STACK.md): refuse now
			// rather than write a checkpoint that crashes the runtime later.
			return nil, nil, status.Errorf(codes.FailedPrecondition, "CheckpointPod: container %s (%s) has no annotations; containerd cannot restore such a checkpoint (create it with at least one annotation; the kubelet always sets some)", short(id), name)
		}
		info, err := s.tasks.Info(ctx, id)
		if err != nil {
			return nil, nil, status.Errorf(codes.Internal, "CheckpointPod: container %s (%s): reading containerd's record: %v", short(id), name, err)
		}
		targets = append(targets, target{id: id, name: name, created: c.GetCreatedAt(), status: st.GetStatus(), info: info})
	}
	slices.SortStableFunc(targets, func(a, b target) int {
		switch {
		case a.created < b.created:
			return -1
		case a.created > b.created:
			return 1
		}
		return 0
	})
	// The latest instance of every other container name that has exited.
	latest := map[string]*runtimeapi.Container{}
	for _, c := range lr.GetContainers() {
		n := c.GetMetadata().GetName()
		if names[n] {
			continue
		}
		if l := latest[n]; l == nil || c.GetCreatedAt() > l.GetCreatedAt() {
			latest[n] = c
		}
	}
	var exited []ExitedEntry
	for n, c := range latest {
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || CheckContainerName(n) != nil {
			continue
		}
		st, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err != nil {
			continue // removed meanwhile: not part of the cut
		}
		exited = append(exited, ExitedEntry{Name: n, ExitCode: st.GetStatus().GetExitCode(),
			RestartCount: restartCount(st.GetStatus().GetAnnotations()), Image: st.GetStatus().GetImage().GetImage()})
	}
	slices.SortFunc(exited, func(a, b ExitedEntry) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return targets, exited, nil
}

func restartCount(ann map[string]string) int {
	n, err := strconv.Atoi(ann[restartCountAnnotation])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// capture pauses every target, captures each, and resumes all, whatever
// happens. On any failure the output directory is emptied.
func (s *Service) capture(ctx context.Context, j *job, targets []target, opts checkpointOptions, m *Manifest) error {
	out, sandboxID := j.out, j.sandbox
	// The mark first: a shim killed after it finds every later file under
	// a marked directory, which the next start empties.
	if err := writeFileSync(filepath.Join(out, incompleteFile), nil); err != nil {
		_ = s.removeOutput(out)
		return status.Errorf(codes.Unavailable, "CheckpointPod: marking the checkpoint incomplete: %v; nothing was paused", err)
	}
	if err := statefile.SyncDir(out); err != nil {
		_ = s.removeOutput(out)
		return status.Errorf(codes.Unavailable, "CheckpointPod: marking the checkpoint incomplete: %v; nothing was paused", err)
	}
	if err := os.Mkdir(filepath.Join(out, containersDir), 0o700); err != nil {
		_ = s.removeOutput(out)
		return status.Errorf(codes.Internal, "CheckpointPod: %v", err)
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
		return status.Errorf(codes.Unavailable, "CheckpointPod: recording the pause: %v; nothing was paused", err)
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
		return fail(status.Errorf(codes.DeadlineExceeded, "CheckpointPod: %s left of the deadline is too little to pause, capture and resume %d containers; nothing was paused",
			time.Until(deadline).Round(time.Millisecond), len(targets)))
	}
	giveUp := time.NewTimer(time.Until(deadline) - margin)
	defer giveUp.Stop()

	// Pause every container before capturing any: one pod-wide cut.
	pausedAt := s.now()
	for i, t := range targets {
		if err := s.tasks.Pause(ctx, t.id); err != nil {
			if rerr := s.thawAll(context.WithoutCancel(ctx), ids[:i], true); rerr != nil {
				s.resumeFailed(rerr)
				return status.Errorf(codes.Internal, "CheckpointPod: pausing %s (%s): %v; and resuming the others failed, cri-shim retries: %v", short(t.id), t.name, err, rerr)
			}
			return fail(status.Errorf(codes.Internal, "CheckpointPod: pausing container %s (%s): %v", short(t.id), t.name, err))
		}
	}

	// Captures run under a context of their own: containerd goes on with a
	// capture after its caller gives up, and the service must know when it
	// ends to resume and clean up after it.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.dumpTimeout)
	errs := make([]error, len(targets))
	took := make([]time.Duration, len(targets))
	done := make(chan struct{})
	var wg sync.WaitGroup
	dump := func(i int) {
		t0 := s.now()
		err := s.captureOne(dctx, out, targets[i])
		took[i], errs[i] = s.now().Sub(t0), err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if opts.sequential {
			for i := range targets {
				if time.Until(deadline) < margin { // the deadline stops further captures
					errs[i] = ctx.Err()
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
			// dumpTimeout ended the wait, not containerd's capture: it
			// would freeze the pod again when it ends. The record stays;
			// Run resumes the containers and empties the output once it
			// has ended (resumeOne).
			s.resumeFailed(fmt.Errorf("capture still running in containerd after %s", s.dumpTimeout))
			return status.Errorf(codes.DeadlineExceeded, "CheckpointPod: containerd's capture did not end within %s; cri-shim resumes every container as soon as it ends", s.dumpTimeout)
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
		rerr := s.thawAll(tctx, ids, true)
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
			s.afterAbandoned(rec)
		}()
		msg := fmt.Sprintf("CheckpointPod: deadline reached %s after the pause while capturing %d containers; the capture was abandoned and its files removed", s.now().Sub(pausedAt).Round(time.Millisecond), len(targets))
		if rerr != nil {
			msg += "; containerd is still capturing (CRIU holds the processes), and cri-shim resumes every container as soon as that capture ends"
		} else {
			msg += "; every container was resumed"
		}
		return status.Error(codes.DeadlineExceeded, msg)
	}

	rerr := s.thawAll(context.WithoutCancel(ctx), ids, true)
	frozen := s.now().Sub(pausedAt)
	s.metrics.frozen.Observe(frozen.Seconds())
	m.FrozenSeconds = frozen.Seconds()
	for i, err := range errs {
		if err != nil {
			msg := fmt.Sprintf("CheckpointPod: capturing container %s (%s): %v", short(targets[i].id), targets[i].name, status.Convert(err).Message())
			code := status.Code(err)
			if code == codes.OK || code == codes.Unknown {
				code = codes.Internal
			}
			if rerr != nil {
				s.resumeFailed(rerr)
				_ = s.removeOutput(out)
				return status.Errorf(code, "%s; resuming failed, cri-shim retries: %v", msg, rerr)
			}
			return fail(status.Error(code, msg+"; every container was resumed and the partial checkpoint removed"))
		}
	}
	if rerr != nil {
		s.resumeFailed(rerr)
		_ = s.removeOutput(out)
		return status.Errorf(codes.Internal, "CheckpointPod: resuming after the capture failed, cri-shim retries: %v", rerr)
	}
	// The pod runs again: write the archives, in parallel.
	sizes := make([]int64, len(targets))
	perrs := make([]error, len(targets))
	cut := s.now().UTC()
	var pw sync.WaitGroup
	for i := range targets {
		pw.Add(1)
		go func() { defer pw.Done(); sizes[i], perrs[i] = s.packageOne(ctx, out, targets[i], cut) }()
	}
	pw.Wait()
	for i, t := range targets {
		if perrs[i] != nil {
			code := codes.Internal
			if ctx.Err() != nil {
				code = codes.DeadlineExceeded
			}
			return fail(status.Errorf(code, "CheckpointPod: writing the archive of container %s (%s): %v; the pod runs, the partial checkpoint was removed", short(t.id), t.name, perrs[i]))
		}
		st := t.status
		imageID := st.GetImageId()
		if imageID == "" {
			imageID = s.imageID(ctx, st.GetImageRef())
		}
		m.Containers = append(m.Containers, ContainerEntry{
			Name: t.name, ID: t.id, Archive: archiveName(t.name),
			Image: st.GetImage().GetImage(), ImageRef: st.GetImageRef(), ImageID: imageID,
			RestartCount: restartCount(st.GetAnnotations()), Attempt: st.GetMetadata().GetAttempt(),
			SizeBytes: sizes[i], DumpSeconds: took[i].Seconds(),
		})
		m.SizeBytes += sizes[i]
	}
	return nil
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
	// still captures: a resume before it ends would be undone.
	for deadline := time.Now().Add(time.Hour); time.Now().Before(deadline); time.Sleep(s.retryEvery / 10) {
		if _, running := s.anyCaptureRunning(rec.Containers); !running {
			break
		}
	}
	var errs []error
	for _, id := range rec.Containers {
		pctx, cancel := context.WithTimeout(ctx, s.resumeTimeout)
		if err := s.tasks.Pause(pctx, id); err != nil && !isNotFound(err) {
			s.log.Debug("checkpoint: re-pause after an abandoned capture", "container", short(id), "err", err)
		}
		cancel()
		if err := s.thaw(ctx, id, true); err != nil {
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

// finish writes the sandbox description and the manifest, then clears the
// incomplete mark.
func (s *Service) finish(out string, sb *runtimeapi.PodSandboxStatusResponse, m *Manifest) error {
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(sb)
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(out, sandboxFile), b); err != nil {
		return err
	}
	m.CheckpointedAt = s.now().UTC()
	if err := writeManifest(out, m); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(out, incompleteFile)); err != nil {
		return err
	}
	return statefile.SyncDir(out)
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func (s *Service) criuVersion() string {
	if s.cfg.CRIUVersion == nil {
		return "unknown"
	}
	v, err := s.cfg.CRIUVersion()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return v
}

func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound || errors.Is(err, os.ErrNotExist)
}
