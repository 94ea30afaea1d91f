package warm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restore"
)

// CompletedMountPath is where a completed init container of a warm-started
// pod finds the shim's binary, which it runs instead of its own command.
const CompletedMountPath = "/.cri-shim/completed"

// warmPod is a sandbox the kubelet asked for with the restore-from
// annotation: its first container of each checkpointed name is restored.
type warmPod struct {
	SandboxID  string `json:"sandboxId"`
	Checkpoint string `json:"checkpoint"`
	Dir        string `json:"dir"`
	// Namespace is the warm-started pod's: the checkpoint was checked
	// against it (restore.Service.Allowed) and is again at every use.
	Namespace string `json:"namespace"`
	// Done are the container names already answered from the checkpoint;
	// later instances (restarts) start fresh.
	Done map[string]bool `json:"done"`
	// Refused is why the image check refused the checkpoint for one of
	// the pod's containers (internal/restore). The pod's spec cannot
	// change, so every later CreateContainer of the sandbox is refused
	// with it (whatever its container: part of the pod's cut is hostile),
	// without reading the checkpoint again, and a pulled
	// checkpoint is removed at once (release): a hostile pull costs the
	// node no disk while its pod stays pending.
	Refused string `json:"refused,omitempty"`
	m       *layout.Manifest
	// release ends the warm start's use of Dir in the store's ledger
	// (Checkpoints.Use); it is called once the checkpoint is refused or
	// the sandbox gone.
	release func()
}

// The service takes part in the calls of a warm start (proxy hooks; a pod's
// admission is the pod table's call, Admit).
var (
	_ proxy.CreateContainerHook = (*Service)(nil)
	_ proxy.Activity            = (*Service)(nil)
)

// HookActive: CreateContainer only while a warm start is under
// way or a pod asking for warm restarts runs; StartContainer only while a
// container created from a checkpoint for the kubelet awaits its start. A
// removed sandbox's warm start and warm restarts are forgotten when the state
// store announces it gone (SandboxGone).
func (s *Service) HookActive(method proxy.Method) bool {
	switch method {
	case proxy.CreateContainer:
		return s.createHooked.Load() > 0
	case proxy.StartContainer:
		return s.pendingN.Load() > 0
	}
	return true
}

// countHooked brings HookActive's counts up to date after a change of
// s.warm, s.warmRestartPods or s.pendingWarm. s.mu held.
func (s *Service) countHooked() {
	s.createHooked.Store(int64(len(s.warm) + len(s.warmRestartPods)))
	s.pendingN.Store(int64(len(s.pendingWarm)))
}

var _ podtable.Admitter = (*Service)(nil)

// Admit warm-starts a sandbox whose pod names a checkpoint: the checkpoint
// is checked before the sandbox is created, so a missing or unusable one
// fails RunPodSandbox with a message the kubelet shows as an event, and the
// kubelet retries (the pod stays Pending). Once the sandbox exists its
// warm-start record is written; one that could not be (statefile's rule: not
// recorded, not acted on) fails the commit, and the pod table removes the
// sandbox. Every new sandbox is noted if its pod asks for warm restarts.
func (s *Service) Admit(ctx context.Context, p *podtable.Pod) (podtable.Admission, error) {
	req := p.Request
	ann := req.GetConfig().GetAnnotations()
	name, ok := ann[podspec.RestoreFromKey]
	if !ok {
		return podtable.Admission{Commit: func(_ context.Context, id string) error {
			s.mu.Lock()
			s.noteWarmRestartPod(id, ann)
			s.mu.Unlock()
			return nil
		}}, nil
	}
	fail := func(kind error, format string, a ...any) error {
		err := proxy.Errorf(kind, "cri-shim: %s %q: %s", podspec.RestoreFromKey, name, fmt.Sprintf(format, a...))
		s.warmStarts.WithLabelValues(proxy.Code(err).String()).Inc()
		return err
	}
	md := req.GetConfig().GetMetadata()
	ns := md.GetNamespace()
	dirName, err := s.restoreDir(ctx, md, name)
	if err != nil {
		if errors.Is(err, layout.ErrCheckpointRefused) {
			s.restore.RefusedArchive(req.GetConfig(), name, err)
		}
		return podtable.Admission{}, fail(err, "%s", proxy.Message(err))
	}
	var adm podtable.Admission
	if strings.HasPrefix(dirName, layout.PulledDirPrefix) {
		// Not evicted by the pulled-checkpoint cap before the warm-start
		// record names it.
		adm.Done = s.ckpts.PinPulled(dirName)
	}
	dir, m, err := s.restore.Open(filepath.Join(s.cfg.Root, dirName), ns)
	if err != nil {
		return adm, fail(err, "%v; the pod stays pending and the kubelet retries", err)
	}
	if err := restore.CheckHandler(m, req.GetRuntimeHandler()); err != nil {
		return adm, fail(errdefs.ErrFailedPrecondition, "%v", err)
	}
	if err := s.restore.CheckRoute(ctx, req.GetRuntimeHandler()); err != nil {
		return adm, fail(err, "%s; the pod stays pending and the kubelet retries", proxy.Message(err))
	}
	adm.Commit = func(_ context.Context, id string) error {
		w := &warmPod{SandboxID: id, Checkpoint: dirName, Dir: dir, Namespace: ns, Done: map[string]bool{}, m: m}
		if err := s.saveWarm(w); err != nil {
			return fail(errdefs.ErrUnavailable, "recording the warm start: %v; the sandbox was removed and the kubelet retries", err)
		}
		w.release = s.ckpts.Use(w.Dir)
		s.mu.Lock()
		s.warm[w.SandboxID] = w
		s.noteWarmRestartPod(w.SandboxID, ann)
		s.countHooked()
		s.mu.Unlock()
		s.warmStarts.WithLabelValues("success").Inc()
		s.log.Info("checkpoint: warm-starting a pod from a checkpoint", "pod", md.GetNamespace()+"/"+md.GetName(),
			"sandbox", w.SandboxID, "checkpoint", name, "dir", dirName, "containers", len(m.Containers))
		return nil
	}
	adm.Undo = func(id string) {
		s.SandboxGone(id)
		s.removeWarmRecord(id)
	}
	return adm, nil
}

// restoreDir is the directory under the root a restore-from value names:
// a checkpoint name, a PodCheckpoint object's data (ResolveRestore), or the
// checkpoint an image reference was pulled into (PullRestore). Its error is
// the classified message the pod's RunPodSandbox fails with.
func (s *Service) restoreDir(ctx context.Context, md *runtimeapi.PodSandboxMetadata, name string) (string, error) {
	ns := md.GetNamespace()
	if layout.IsImageRef(name) {
		return s.pullRestore(ctx, md, name)
	}
	if err := layout.CheckName(name); err != nil {
		return "", proxy.Errorf(errdefs.ErrInvalidArgument, "%v", err)
	}
	switch layout.ReservedPrefix(name) {
	case layout.ObjectDirPrefix:
		// A PodCheckpoint's data: restored only by the object's name, so
		// its Ready and PodSpecMismatch checks cannot be stepped around.
		return "", proxy.Errorf(errdefs.ErrInvalidArgument, "names beginning %q are PodCheckpoint data; name the PodCheckpoint object instead", layout.ObjectDirPrefix)
	case layout.PulledDirPrefix:
		// Pulled for an image reference: restored only through it, so the
		// registry allow-list judges every restore.
		return "", proxy.Errorf(errdefs.ErrInvalidArgument, "names beginning %q are checkpoints pulled from a registry; name the image reference instead", layout.PulledDirPrefix)
	}
	if s.cfg.ResolveRestore == nil || isDir(filepath.Join(s.cfg.Root, name)) {
		return name, nil
	}
	d, err := s.cfg.ResolveRestore(ctx, ns, md.GetName(), md.GetUid(), name)
	if err != nil {
		var kind error = errdefs.ErrFailedPrecondition
		if errdefs.IsUnavailable(err) {
			kind = errdefs.ErrUnavailable
		}
		return "", proxy.Errorf(kind, "%v; the pod stays pending and the kubelet retries", err)
	}
	if layout.IsImageRef(d) {
		return s.pullRestore(ctx, md, d)
	}
	if err := layout.CheckName(d); err != nil || !strings.HasPrefix(d, layout.ObjectDirPrefix) {
		return "", proxy.Errorf(errdefs.ErrFailedPrecondition, "PodCheckpoint location %q: not a PodCheckpoint's data directory (%v)", d, err)
	}
	return d, nil
}

// pullRestore is the directory an image reference was pulled into.
func (s *Service) pullRestore(ctx context.Context, md *runtimeapi.PodSandboxMetadata, ref string) (string, error) {
	ns := md.GetNamespace()
	if s.cfg.PullRestore == nil {
		return "", proxy.Errorf(errdefs.ErrInvalidArgument, "image reference %q: this shim restores no image references (it has no [checkpoint] registries)", ref)
	}
	d, err := s.cfg.PullRestore(ctx, ns, md.GetName(), md.GetUid(), ref, s.ckpts.ReservePulled)
	switch {
	case errors.Is(err, layout.ErrForeignCheckpoint):
		return "", proxy.Errorf(errdefs.ErrNotFound, "image %s: %s; the pod stays pending and the kubelet retries", ref, proxy.Message(s.restore.NoCheckpoint(ref, ns, err)))
	case err != nil:
		kind := err
		if !errdefs.IsInvalidArgument(err) && !errdefs.IsPermissionDenied(err) && !errdefs.IsUnavailable(err) &&
			!errdefs.IsFailedPrecondition(err) && !errdefs.IsResourceExhausted(err) {
			kind = errdefs.ErrUnavailable
		}
		return "", proxy.Errorf(kind, "%v; the pod stays pending and the kubelet retries", err)
	}
	if layout.CheckName(d) != nil || !strings.HasPrefix(d, layout.PulledDirPrefix) {
		return "", proxy.Errorf(errdefs.ErrInternal, "image %s: pulled into %q, not a pulled checkpoint's directory", ref, d)
	}
	return d, nil
}

// CreateContainer answers the kubelet's first CreateContainer of each
// checkpointed name in a warm-started sandbox with the restored container,
// and runs a completed init container as a no-op that exits 0 at once.
func (s *Service) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	s.mu.Lock()
	w := s.warm[req.GetPodSandboxId()]
	name := req.GetConfig().GetMetadata().GetName()
	if w != nil && w.Refused != "" {
		refused := w.Refused
		s.mu.Unlock()
		return nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "cri-shim: container %q: checkpoint %q was refused for this pod (%s): the pod creates no more containers; delete it, or restore another checkpoint", name, w.Checkpoint, refused)
	}
	if w == nil || w.Done[name] {
		restart := s.warmRestartPods[req.GetPodSandboxId()] && req.GetConfig().GetMetadata().GetAttempt() > 0
		s.mu.Unlock()
		if restart {
			return s.kubeletWarmRestart(ctx, req, next)
		}
		return next(ctx, req)
	}
	s.mu.Unlock()
	// The binding again, against the namespace of the sandbox config the
	// kubelet sends with the call: nothing of the checkpoint is told, and
	// nothing restored, unless it holds (the record may predate a change of
	// the allow-list).
	ns := req.GetSandboxConfig().GetMetadata().GetNamespace()
	if ns == "" {
		ns = w.Namespace
	}
	if !s.restore.Allowed(w.m.Pod.Namespace, ns) {
		err := s.restore.NoCheckpoint(w.Dir, ns, fmt.Errorf("warm start of sandbox %s: checkpoint of namespace %q", short(w.SandboxID), w.m.Pod.Namespace))
		return nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "cri-shim: container %q: %s %q: %v", name, podspec.RestoreFromKey, w.Checkpoint, err)
	}
	cfg, archive, how, err := s.warmConfig(ctx, req.GetConfig(), name, w.Checkpoint, w.Dir, w.m)
	if err != nil {
		return nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "cri-shim: container %q: %v", name, err)
	}
	if cfg == nil {
		return next(ctx, req)
	}
	r := proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	r.Config = cfg
	resp, err := next(ctx, r)
	if err != nil {
		return nil, err
	}
	if archive != "" {
		id := resp.GetContainerId()
		refused := func(rf *criucheck.Refusal) { s.refuseWarm(w.SandboxID, short(id), rf) }
		if err := s.restore.Stage(ctx, r.GetSandboxConfig(), req.GetPodSandboxId(), id, archive, restore.ContainerLogPath(r.GetSandboxConfig(), cfg), refused); err != nil {
			s.undoUnrecorded("container", resp.GetContainerId(), func(ctx context.Context) error {
				_, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.GetContainerId()})
				return err
			})
			var ref *criucheck.Refusal
			if errors.As(err, &ref) {
				s.refuseWarm(w.SandboxID, name, ref)
			}
			return nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "cri-shim: container %q: checkpoint %q: %v; the container was removed", name, w.Checkpoint, err)
		}
	}
	s.mu.Lock()
	w.Done[name] = true
	err = s.saveWarm(w)
	if err != nil {
		delete(w.Done, name)
	}
	s.mu.Unlock()
	if err != nil {
		// Unrecorded, a restarted shim would restore this name again at its
		// next instance: the container goes, and the kubelet's retry is
		// answered from the checkpoint again.
		s.undoUnrecorded("container", resp.GetContainerId(), func(ctx context.Context) error {
			_, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.GetContainerId()})
			return err
		})
		return nil, proxy.Errorf(errdefs.ErrUnavailable, "cri-shim: container %q: recording the warm start: %v; the container was removed and the kubelet retries", name, err)
	}
	s.log.Info("checkpoint: warm start container", "sandbox", w.SandboxID, "container", name, "id", resp.GetContainerId(), "how", how)
	return resp, nil
}

// warmConfig is cfg rewritten to start container name from checkpoint cp (in
// dir, already confined; m its manifest): restored from archive, which the
// created container's restore is staged from, or, for a container that had
// completed before the checkpoint, run as a no-op through the shim's own
// binary (archive ""). It is nil when the checkpoint has nothing for the
// container (it starts fresh), and an error when it has but cannot be used.
// how says which, for the log.
func (s *Service) warmConfig(ctx context.Context, cfg *runtimeapi.ContainerConfig, name, cp, dir string, m *layout.Manifest) (_ *runtimeapi.ContainerConfig, archive, how string, _ error) {
	if e, ok := m.Container(name); ok {
		if !s.restore.ImageMatches(ctx, cfg.GetImage(), e) {
			return nil, "", "", fmt.Errorf("image %q is not the checkpointed image %q; checkpoint %q cannot warm-start it",
				cfg.GetImage().GetImage(), e.Image, cp)
		}
		archive, err := layout.ArchivePath(dir, e)
		if err != nil {
			return nil, "", "", fmt.Errorf("checkpoint %q cannot warm-start it: %v", cp, err)
		}
		return restore.RestoredConfig(cfg, e), archive, "restored", nil
	}
	x := m.ExitedContainer(name)
	if x == nil || x.ExitCode != 0 || s.cfg.ShimBinary == "" {
		return nil, "", "", nil
	}
	c := proto.Clone(cfg).(*runtimeapi.ContainerConfig)
	c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: CompletedMountPath, HostPath: s.cfg.ShimBinary, Readonly: true})
	c.Command = []string{CompletedMountPath}
	c.Args = []string{"completed", name, cp}
	c.WorkingDir = "/"
	if capture.RestartCount(c.Annotations) < x.RestartCount {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[capture.RestartCountAnnotation] = strconv.Itoa(x.RestartCount)
	}
	return c, "", "completed before the checkpoint; run as a no-op", nil
}

// undoUnrecorded removes what a warm-start step created when its record could
// not be made durable, under a fresh context (the caller's may be ending).
func (s *Service) undoUnrecorded(what, id string, undo func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := undo(ctx); err != nil && !proxy.NotFound(err) {
		s.log.Error("checkpoint: removing a warm-start "+what+" whose record could not be written", what, id, "err", err)
	}
}

// isDir reports whether p is a directory (or a symlink to one: confine judges it).
func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
