package restore

// Every restore (RestorePod, warm start, warm restart) creates the container
// through the CRI from the new pod's own config, like any other: its image
// is the one the kubelet pulled for the pod, its mounts, env, devices,
// annotations and security context are the pod's. Then Stage copies
// the CRIU images and the rootfs changes out of the container's archive into
// a staging directory and leaves a mark (internal/restoremark). When the
// container is started, containerd asks the pod's runtime shim
// (cmd/containerd-shim-cri-shim-v2) to create its task; the runtime shim
// claims the mark and creates the task as a restore from the staged images.
// Finish, after the start, checks that it did: a container that
// started without its checkpoint (the handler's runtime is not cri-shim's
// runtime shim) is stopped, and the start fails saying why. Nothing of the
// archive but the CRIU images, the rootfs diff and the log reaches the node:
// config.dump, spec.dump and status.dump are never read
// (docs/restore-route.md).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckptarchive"
	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// RestoringAnnotation marks a container created for a restore: one that a
// shim killed before its restore was staged leaves CREATED without a mark,
// and the next shim removes it (Recover) rather than let a start run
// its image afresh.
const RestoringAnnotation = "checkpoint.cri-shim.io/restoring"

// stagingDirName holds the staged restores under the checkpoint root (the
// same file system as the archives, so the copy is in the kernel); a
// leading dot keeps it out of the checkpoint listing.
const stagingDirName = ".restore-staging"

func (s *Service) stagingRoot() string { return filepath.Join(s.cfg.Root, stagingDirName) }

// staged is a restore staged for a container not started yet.
type staged struct {
	dir     string // the staging directory
	sandbox string // the container's sandbox; "" when recovered
	// sb is the sandbox's config, for an event on the pod; nil when
	// recovered.
	sb *runtimeapi.PodSandboxConfig
	// refused, when set, is told of the runtime shim's refusal of the
	// restore (a warm start records it).
	refused func(*criucheck.Refusal)
}

// Stage prepares the restore of container id of sandbox, just created by
// the runtime, from its archive: the CRIU images and rootfs changes are
// copied into id's staging directory, the log into the container's log file
// (logPath, "" for none), the images and the rootfs changes checked against
// the container's spec (check.go; sb is the sandbox's config), and the mark
// left for the runtime shim, with the bound the rootfs changes were held to.
// refused, when set, is told if the runtime shim refuses the restore at the
// container's start. On error nothing is left behind; the caller removes the
// container.
func (s *Service) Stage(ctx context.Context, sb *runtimeapi.PodSandboxConfig, sandbox, id, archive, logPath string, refused func(*criucheck.Refusal)) (err error) {
	root := s.stagingRoot()
	if err := os.Mkdir(root, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("staging the restore: %w", err)
	}
	dir := filepath.Join(root, id)
	_ = os.RemoveAll(dir) // a leftover of a crashed shim for the same ID
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("staging the restore: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	files, err := ckptarchive.Extract(archive, dir)
	if err != nil {
		return fmt.Errorf("archive %s: %w", filepath.Base(archive), err)
	}
	if err := s.checkStaged(ctx, sb, id, files.Images, files.Diff); err != nil {
		return fmt.Errorf("archive %s: %w", filepath.Base(archive), err)
	}
	if logPath != "" && files.LogSize >= 0 {
		if err := ckptarchive.CopyLog(archive, files.LogOff, files.LogSize, logPath); err != nil {
			s.log.Warn("checkpoint: the restored container's log starts empty; copying the checkpoint's failed", "container", id, "err", err)
		}
	}
	s.mu.Lock()
	s.staged[id] = staged{dir: dir, sandbox: sandbox, sb: sb, refused: refused}
	s.stagedN.Store(int64(len(s.staged)))
	s.mu.Unlock()
	mark := restoremark.Mark{Images: files.Images, RootfsDiff: files.Diff}
	if files.Diff != "" {
		mark.RootfsDiffMaxBytes = s.rootfsDiffMax()
	}
	if err := s.cfg.RestoreMarks.Write(id, mark); err != nil {
		s.unstage(id)
		return fmt.Errorf("staging the restore: %w", err)
	}
	return nil
}

// unstage forgets container id's staged restore and removes its files and
// mark; it reports whether the runtime shim had claimed the mark.
func (s *Service) unstage(id string) (wasStaged, claimed bool) {
	s.mu.Lock()
	st, ok := s.staged[id]
	delete(s.staged, id)
	s.stagedN.Store(int64(len(s.staged)))
	s.mu.Unlock()
	if !ok {
		return false, false
	}
	dir := st.dir
	claimed = s.cfg.RestoreMarks.Claimed(id)
	if claimed {
		if r := s.cfg.RestoreMarks.Refused(id); r != nil {
			s.runtimeRefused(st, id, r)
		}
	}
	if err := s.cfg.RestoreMarks.Remove(id); err != nil {
		s.log.Warn("checkpoint: removing a restore mark", "container", id, "err", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		s.log.Warn("checkpoint: removing a staged restore", "container", id, "err", err)
	}
	return true, claimed
}

// runtimeRefused handles the runtime shim's refusal r of container id's
// restore (st, claimed): counted, an event on the pod and the stager told
// (st.refused), as of one of this shim's own refusals.
func (s *Service) runtimeRefused(st staged, id string, r *restoremark.Refusal) {
	ref := &criucheck.Refusal{Image: r.Image, Field: r.Field, Reason: r.Reason}
	s.refusals.WithLabelValues(criucheck.RefusalKind(ref.Image)).Inc()
	s.log.Warn("checkpoint: restore refused by the runtime shim", "container", id, "image", ref.Image, "field", ref.Field, "reason", ref.Reason)
	if st.sb != nil {
		s.PodEvent(st.sb, "Warning", "CheckpointRefused", "Restore", ref.Error())
	}
	if st.refused != nil {
		st.refused(ref)
	}
}

// Finish ends container id's staged restore once its start returned
// startErr. A start that succeeded without the runtime shim claiming the
// mark ran the container's image afresh: the container is stopped and the
// start fails, saying what the node lacks. Containers that were not staged
// get startErr back unchanged.
func (s *Service) Finish(id string, startErr error) error {
	wasStaged, claimed := s.unstage(id)
	switch {
	case !wasStaged:
		return startErr
	case startErr != nil:
		s.restoreStarts.WithLabelValues("failed").Inc()
		return startErr
	case claimed:
		s.restoreStarts.WithLabelValues("restored").Inc()
		return nil
	}
	s.restoreStarts.WithLabelValues("not_restored").Inc()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil && !proxy.NotFound(err) {
		s.log.Error("checkpoint: stopping a container that started without its checkpoint", "container", id, "err", err)
	}
	return errNotRestored(id)
}

func errNotRestored(id string) error {
	return proxy.Errorf(errdefs.ErrFailedPrecondition,
		"cri-shim: container %s started without its checkpoint and was stopped: the runtime of its pod's handler is not cri-shim's runtime shim (%s), "+
			"so containerd created its task fresh; set it as the handler's runtime_path (deploy/install.sh does, `cri-shim doctor` checks) and restart the pod's sandbox",
		short(id), restoremark.RuntimeShimName)
}

// SandboxGone drops the staged restores of a removed sandbox's containers
// (the state store's lifecycle: the server's feature list subscribes it).
func (s *Service) SandboxGone(sandbox string) {
	s.mu.Lock()
	var ids []string
	for id, st := range s.staged {
		if st.sandbox == sandbox {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.unstage(id)
	}
}

// CheckRoute refuses a restore, before anything is created, under a handler
// whose runtime is not cri-shim's runtime shim, as containerd's CRI
// configuration says. When that cannot be read the restore goes on:
// Finish still catches a start without the checkpoint.
func (s *Service) CheckRoute(ctx context.Context, handler string) error {
	st, err := s.rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil || st.GetInfo()["config"] == "" {
		return nil
	}
	r, err := restoremark.HandlerRoute(st.GetInfo()["config"], handler)
	if err != nil || r.Restores {
		return nil
	}
	return proxy.Errorf(errdefs.ErrFailedPrecondition, "handler %q runs containerd's own runc shim, which cannot restore a checkpoint: "+
		"cri-shim's runtime shim (%s) must be its runtime_path (deploy/install.sh --with-containerd; `cri-shim doctor` checks)", r.Handler, restoremark.RuntimeShimName)
}

// Recover takes up, once at start before any call is served, the restores
// a killed shim staged: a mark whose container still waits for its start is
// kept (its start restores it); any other mark and staging directory of
// this shim is removed, and so is a container created for a restore before
// this service started that waits for its start without a mark (the shim
// was killed between the create and the mark).
func (s *Service) Recover(ctx context.Context) {
	defer s.removeUnmarked(ctx)
	root := s.stagingRoot()
	ents, _ := s.cfg.RestoreMarks.List()
	kept := map[string]bool{}
	for _, e := range ents {
		if e.Mark == nil || !layout.Within(root, e.Mark.Images) {
			continue // another shim's (a second node on the machine) or unreadable
		}
		dir := filepath.Join(root, e.ID)
		if !e.Claimed && s.createdContainer(ctx, e.ID) {
			s.mu.Lock()
			s.staged[e.ID] = staged{dir: dir}
			s.stagedN.Store(int64(len(s.staged)))
			s.mu.Unlock()
			kept[e.ID] = true
			continue
		}
		_ = s.cfg.RestoreMarks.Remove(e.ID)
	}
	dirs, _ := os.ReadDir(root)
	for _, d := range dirs {
		if !kept[d.Name()] {
			_ = os.RemoveAll(filepath.Join(root, d.Name()))
		}
	}
	if len(kept) > 0 {
		s.log.Info("checkpoint: restores staged before a restart still wait for their containers' start", "containers", len(kept))
	}
}

// removeUnmarked removes the containers created for a restore by an earlier
// shim that are still CREATED and have no mark: started, they would run their
// image afresh.
func (s *Service) removeUnmarked(ctx context.Context) {
	list, err := s.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_CREATED}}})
	if err != nil {
		s.log.Warn("checkpoint: listing containers created for a restore", "err", err)
		return
	}
	s.mu.Lock()
	staged := make(map[string]bool, len(s.staged))
	for id := range s.staged {
		staged[id] = true
	}
	s.mu.Unlock()
	for _, c := range list.GetContainers() {
		if c.GetAnnotations()[RestoringAnnotation] != "true" || staged[c.GetId()] || c.GetCreatedAt() >= s.startedAt.UnixNano() {
			continue
		}
		if _, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.GetId()}); err != nil && !proxy.NotFound(err) {
			s.log.Warn("checkpoint: removing a container whose restore was never staged", "container", c.GetId(), "err", err)
			continue
		}
		s.log.Info("checkpoint: removed a container created for a restore that a killed shim never staged", "container", c.GetId())
	}
}

// createdContainer reports whether the runtime has container id, created and
// not started.
func (s *Service) createdContainer(ctx context.Context, id string) bool {
	r, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	return err == nil && r.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_CREATED
}

// ContainerLogPath is where the runtime writes a container's log: the
// sandbox's log directory joined with the container's relative log path;
// "" when either is missing or the path leaves the directory.
func ContainerLogPath(sb *runtimeapi.PodSandboxConfig, c *runtimeapi.ContainerConfig) string {
	dir, p := sb.GetLogDirectory(), c.GetLogPath()
	if dir == "" || p == "" || !filepath.IsAbs(dir) || !filepath.IsLocal(p) {
		return ""
	}
	return filepath.Join(dir, p)
}

// PodEvent tells the pod of sandbox config sb's events, when the shim has
// an API connection.
func (s *Service) PodEvent(sb *runtimeapi.PodSandboxConfig, eventType, reason, action, note string) {
	if s.cfg.PodEvent == nil {
		return
	}
	md := sb.GetMetadata()
	s.cfg.PodEvent(md.GetNamespace(), md.GetName(), md.GetUid(), eventType, reason, action, note)
}
