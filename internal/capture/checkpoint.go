package capture

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// CheckpointPod serves the CRI call (KEP-5823): one consistent cut of the
// selected containers of a pod, written under req.OutputPath.
func (s *Service) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	start := s.now()
	m, err := s.checkpointPod(ctx, req)
	if err != nil {
		s.metrics.checkpoints.WithLabelValues(code(err).String()).Inc()
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

func (s *Service) checkpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*layout.Manifest, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: the call has no deadline; the CRI contract requires one")
	}
	opts, err := parseCheckpointOptions(req.GetOptions())
	if err != nil {
		return nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: %v", err)
	}
	sandboxID := req.GetPodSandboxId()
	if sandboxID == "" {
		return nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: pod_sandbox_id is empty")
	}
	ids := req.GetContainerIds()
	if len(ids) == 0 {
		return nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: container_ids is empty; name the running containers to capture")
	}
	for i, id := range ids {
		if id == "" {
			return nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: container_ids[%d] is empty", i)
		}
		if slices.Index(ids, id) != i {
			return nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: container %q is listed twice", id)
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
		return nil, errorf(errdefs.ErrFailedPrecondition, "CheckpointPod: sandbox %s is %s, not ready", short(sandboxID), st)
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
		return nil, errorf(errdefs.ErrFailedPrecondition, "CheckpointPod: sandbox %s shares one PID namespace between its containers (shareProcessNamespace); "+
			"cri-shim cannot restore several containers of such a pod reliably, so it does not checkpoint them together (checkpoint one container at a time)", short(sandboxID))
	}

	md := sb.GetStatus().GetMetadata()
	if s.cfg.Admit != nil {
		ids := make([]string, len(targets))
		for i, t := range targets {
			ids[i] = t.id
		}
		// The capture refuses less than twice the resume margin left
		// (capture.go): a wait for admission leaves that much.
		done, err := s.cfg.Admit(ctx, Admission{Namespace: md.GetNamespace(), Pod: md.GetName(), UID: md.GetUid(), SandboxID: sandboxID,
			Managed: opts.managed, Containers: ids, Margin: 2 * s.resumeMargin(len(targets))})
		if err != nil {
			return nil, errorf(err, "CheckpointPod: %v; nothing was paused", err)
		}
		j.admitted = done
	}
	ver, _ := s.rt.Version(ctx, &runtimeapi.VersionRequest{})
	m := &layout.Manifest{
		FormatVersion: layout.Version,
		Pod: layout.PodInfo{Name: md.GetName(), Namespace: md.GetNamespace(), UID: md.GetUid(), SandboxID: sandboxID,
			RuntimeHandler: sb.GetStatus().GetRuntimeHandler()},
		Exited:      exited,
		Managed:     opts.managed,
		Runtime:     ver.GetRuntimeName() + " " + ver.GetRuntimeVersion(),
		CRIUVersion: s.criuVersion(),
		Kernel:      kernelRelease(),
		CgroupMode:  layout.NodeCgroupMode(),
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
		return nil, errorf(errdefs.ErrInternal, "CheckpointPod: writing the checkpoint's manifest: %v (partial checkpoint removed)", err)
	}
	if s.cfg.Retain != nil {
		if err := s.cfg.Retain(out, m.Pod.Namespace); err != nil {
			_ = s.removeOutput(out)
			return nil, errorf(err, "CheckpointPod: %v (the checkpoint was removed)", err)
		}
	}
	return m, nil
}

// outputDir checks output_path: absolute, inside the root after symlinks, an
// existing directory. checkEmpty checks it is empty once the call owns it.
func (s *Service) outputDir(p string) (string, error) {
	out, err := layout.Confine(s.cfg.Root, p)
	if err != nil {
		return "", errorf(errdefs.ErrInvalidArgument, "CheckpointPod: output_path: %v", err)
	}
	// A pulled checkpoint's directory is named after its digest and
	// trusted as that content: nothing else writes there.
	realRoot, _ := filepath.EvalSymlinks(s.cfg.Root)
	if rel, err := filepath.Rel(realRoot, out); err == nil && strings.HasPrefix(rel, layout.PulledDirPrefix) {
		return "", errorf(errdefs.ErrInvalidArgument, "CheckpointPod: output_path %q: directories beginning %q hold checkpoints pulled from a registry", p, layout.PulledDirPrefix)
	}
	fi, err := os.Stat(out)
	if err != nil {
		return "", errorf(errdefs.ErrInvalidArgument, "CheckpointPod: output_path: %v", err)
	}
	if !fi.IsDir() {
		return "", errorf(errdefs.ErrInvalidArgument, "CheckpointPod: output_path %q is not a directory", p)
	}
	return out, nil
}

func checkEmpty(out, p string) error {
	ents, err := os.ReadDir(out)
	if err != nil {
		return errorf(errdefs.ErrInvalidArgument, "CheckpointPod: output_path: %v", err)
	}
	if len(ents) > 0 {
		return errorf(errdefs.ErrFailedPrecondition, "CheckpointPod: output_path %q is not empty (%d entries, first %q)", p, len(ents), ents[0].Name())
	}
	return nil
}

// finish writes the sandbox description and the manifest, then clears the
// incomplete mark.
func (s *Service) finish(out string, sb *runtimeapi.PodSandboxStatusResponse, m *layout.Manifest) error {
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(sb)
	if err != nil {
		return err
	}
	if err := layout.WriteFileSync(filepath.Join(out, layout.SandboxFile), b); err != nil {
		return err
	}
	m.CheckpointedAt = s.now().UTC()
	if err := layout.WriteManifest(out, m); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(out, layout.IncompleteFile)); err != nil {
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
