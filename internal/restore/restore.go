package restore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// RestorePod serves the CRI call (KEP-5823): a new sandbox from req.Config and
// one CREATED container per checkpointed container, made from the request's
// own configs; StartContainer on each then restores its processes from the
// checkpoint (stage.go).
func (s *Service) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	start := s.now()
	resp, err := s.restorePod(ctx, req)
	if err != nil {
		s.restores.WithLabelValues(proxy.Code(err).String()).Inc()
		s.log.Warn("checkpoint: RestorePod failed", "path", req.GetCheckpointPath(), "err", err)
		return nil, err
	}
	d := s.now().Sub(start)
	s.restores.WithLabelValues("success").Inc()
	s.restoreTime.Observe(d.Seconds())
	md := req.GetConfig().GetMetadata()
	s.log.Info("checkpoint: pod restored (containers created)", "pod", md.GetNamespace()+"/"+md.GetName(),
		"sandbox", resp.PodSandboxId, "containers", len(resp.RestoredContainers), "seconds", d.Seconds())
	return resp, nil
}

// Open confines and reads the checkpoint directory p for a pod of
// namespace ns. Until the checkpoint is known to be one that ns may restore
// (Allowed), every refusal is the same errNoCheckpoint, so that a
// caller learns nothing of a checkpoint of another namespace, not even
// whether it exists; the details go to the shim's log only. After that check,
// refusals say what is wrong, and every archive is confined to the directory.
func (s *Service) Open(p, ns string) (string, *layout.Manifest, error) {
	dir, err := layout.Confine(s.cfg.Root, p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !errors.Is(err, layout.ErrOutsideRoot) {
			return "", nil, s.NoCheckpoint(p, ns, err)
		}
		return "", nil, proxy.Errorf(errdefs.ErrInvalidArgument, "checkpoint path: %v", err)
	}
	m, err := layout.ReadManifestUnvalidated(dir)
	if err != nil {
		return "", nil, s.NoCheckpoint(dir, ns, err)
	}
	if !s.Allowed(m.Pod.Namespace, ns) {
		return "", nil, s.NoCheckpoint(dir, ns, fmt.Errorf("taken of pod %s/%s; namespace %q may not restore from namespace %q",
			m.Pod.Namespace, m.Pod.Name, ns, m.Pod.Namespace))
	}
	if err := m.Validate(); err != nil {
		return "", nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "checkpoint %s: manifest: %v", dir, err)
	}
	if node := nodeCgroupMode(); m.CgroupMode != "" && m.CgroupMode != node {
		return "", nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "checkpoint %s was taken on a cgroup %s node and this node runs cgroup %s: "+
			"CRIU's cgroup images of one mode do not describe a container of the other", dir, m.CgroupMode, node)
	}
	for _, c := range m.Containers {
		if _, err := layout.ArchivePath(dir, c); err != nil {
			return "", nil, proxy.Errorf(errdefs.ErrFailedPrecondition, "checkpoint %s: container %q: %v", dir, c.Name, err)
		}
	}
	return dir, m, nil
}

// nodeCgroupMode is the node's cgroup mode (a variable for tests).
var nodeCgroupMode = layout.NodeCgroupMode

// Allowed is the namespace binding of a restore (docs/checkpoint.md):
// a pod of namespace to may start from a checkpoint of a pod of namespace
// from only when they are the same, or the operator listed the pair.
func (s *Service) Allowed(from, to string) bool {
	return from == to || s.cfg.RestoreAcrossNamespaces != nil && s.cfg.RestoreAcrossNamespaces(from, to)
}

// NoCheckpoint is the one answer for a checkpoint that is missing,
// incomplete, unreadable or of a namespace the pod may not restore from. It
// names the rule and nothing of the checkpoint; why is logged for the operator.
func (s *Service) NoCheckpoint(path, ns string, why error) error {
	s.log.Warn("checkpoint: restore refused", "path", path, "podNamespace", ns, "reason", why)
	return proxy.Errorf(errdefs.ErrNotFound, "no checkpoint that a pod of namespace %q may restore: "+
		"it does not exist, is incomplete, or was taken of a pod in another namespace "+
		"(a pod restores only from a checkpoint of a pod in its own namespace unless the node's [checkpoint] restore_namespace_allow lists the pair)", ns)
}

// CheckHandler refuses a runtime handler other than the checkpoint's.
func CheckHandler(m *layout.Manifest, handler string) error {
	if handler != m.Pod.RuntimeHandler {
		return proxy.Errorf(errdefs.ErrFailedPrecondition, "runtime handler %q cannot restore a checkpoint taken under handler %q", handler, m.Pod.RuntimeHandler)
	}
	return nil
}

// ImageMatches reports whether a restore-time image is the checkpointed one:
// the same name or reference, or a name the runtime resolves to the same
// image ID (one image often has several names).
func (s *Service) ImageMatches(ctx context.Context, spec *runtimeapi.ImageSpec, e layout.ContainerEntry) bool {
	img := spec.GetImage()
	if img == "" {
		return true
	}
	for _, v := range []string{e.Image, e.ImageRef, e.ImageID} {
		if v != "" && (img == v || strings.TrimPrefix(img, "sha256:") == strings.TrimPrefix(v, "sha256:")) {
			return true
		}
	}
	if spec.GetUserSpecifiedImage() != "" && spec.GetUserSpecifiedImage() == e.Image {
		return true
	}
	id := capture.ImageID(ctx, s.img, img)
	return id != "" && id == e.ImageID
}

// RestoredConfig is the pod's own cfg with the checkpoint's restart count
// and RestoringAnnotation: the container is created from it as any other,
// and restored at its start from what Stage staged
// (stage.go). Nothing of the archive goes into it.
func RestoredConfig(cfg *runtimeapi.ContainerConfig, e layout.ContainerEntry) *runtimeapi.ContainerConfig {
	c := proto.Clone(cfg).(*runtimeapi.ContainerConfig)
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[RestoringAnnotation] = "true"
	if capture.RestartCount(c.Annotations) < e.RestartCount {
		c.Annotations[capture.RestartCountAnnotation] = strconv.Itoa(e.RestartCount)
	}
	return c
}

// createRestored creates container e of a restore from the pod's config
// cfg (sandbox config sb) in sandbox, and stages its restore from archive;
// a container whose staging failed is removed.
func (s *Service) createRestored(ctx context.Context, sandbox string, sb *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig,
	e layout.ContainerEntry, archive string) (string, error) {
	c := RestoredConfig(cfg, e)
	cr, err := s.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, Config: c, SandboxConfig: sb})
	if err != nil {
		return "", proxy.Errorf(err, "%s", proxy.Message(err))
	}
	id := cr.GetContainerId()
	if err := s.Stage(ctx, sb, sandbox, id, archive, ContainerLogPath(sb, c), nil); err != nil {
		if _, rerr := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); rerr != nil && !proxy.NotFound(rerr) {
			s.log.Error("checkpoint: removing a container whose restore could not be staged", "container", id, "err", rerr)
		}
		return "", proxy.Errorf(errdefs.ErrFailedPrecondition, "%v", err)
	}
	return id, nil
}

// Timeout bounds the runtime calls of one restore (a RestorePod, the
// staging of a warm restart), whatever the caller's deadline (see restorePod).
const Timeout = 4 * time.Minute

func (s *Service) restorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: the call has no deadline; the CRI contract requires one")
	}
	if opts := req.GetOptions(); len(opts) > 0 { // RestorePod has no runtime options yet
		return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: unknown restore option %q (this runtime has no restore options)", slices.Min(slices.Collect(maps.Keys(opts))))
	}
	if req.GetConfig() == nil {
		return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: config (the new sandbox's configuration) is missing")
	}
	dir, m, err := s.Open(req.GetCheckpointPath(), req.GetConfig().GetMetadata().GetNamespace())
	if err != nil {
		return nil, fmt.Errorf("RestorePod: %w", err)
	}
	cfgs := req.GetContainerConfigs()
	if len(cfgs) == 0 {
		return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: container_configs is empty")
	}
	byName := make(map[string]*runtimeapi.ContainerConfig, len(cfgs))
	for i, c := range cfgs {
		n := c.GetMetadata().GetName()
		if n == "" {
			return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: container_configs[%d] has no metadata name", i)
		}
		if byName[n] != nil {
			return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: container %q is configured twice", n)
		}
		byName[n] = c
	}
	var missing, extra []string
	for _, e := range m.Containers {
		if byName[e.Name] == nil {
			missing = append(missing, e.Name)
		}
	}
	for n := range byName {
		if _, ok := m.Container(n); !ok {
			extra = append(extra, n)
		}
	}
	if len(missing)+len(extra) > 0 {
		slices.Sort(extra)
		return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: container names must be exactly the checkpoint's %v: missing %v, not in the checkpoint %v",
			names(m), missing, extra)
	}
	for _, e := range m.Containers {
		if byName[e.Name].GetImage().GetImage() == "" {
			return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: container %q: the config names no image; the container is created from the pod's own image, the checkpointed one (%s)", e.Name, e.Image)
		}
		if img := byName[e.Name].GetImage(); !s.ImageMatches(ctx, img, e) {
			return nil, proxy.Errorf(errdefs.ErrInvalidArgument, "RestorePod: container %q: image %q is not the checkpointed image %q (%s)", e.Name, img.GetImage(), e.Image, e.ImageRef)
		}
	}
	if err := CheckHandler(m, req.GetRuntimeHandler()); err != nil {
		return nil, fmt.Errorf("RestorePod: %w", err)
	}
	if err := s.CheckRoute(ctx, req.GetRuntimeHandler()); err != nil {
		return nil, fmt.Errorf("RestorePod: %w", err)
	}

	// The runtime's calls run to completion whatever the caller's deadline,
	// so that the service knows what exists and can remove it on failure.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	sb, err := s.rt.RunPodSandbox(rctx, &runtimeapi.RunPodSandboxRequest{Config: req.GetConfig(), RuntimeHandler: req.GetRuntimeHandler()})
	if err != nil {
		return nil, proxy.Errorf(err, "RestorePod: creating the sandbox: %s", proxy.Message(err))
	}
	resp := &runtimeapi.RestorePodResponse{PodSandboxId: sb.GetPodSandboxId()}
	undo := func(cause error) error {
		var errs []error
		for _, rc := range resp.RestoredContainers {
			s.unstage(rc.ContainerId)
			if _, err := s.rt.RemoveContainer(rctx, &runtimeapi.RemoveContainerRequest{ContainerId: rc.ContainerId}); err != nil && !proxy.NotFound(err) {
				errs = append(errs, err)
			}
		}
		if _, err := s.rt.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil && !proxy.NotFound(err) {
			errs = append(errs, err)
		}
		if _, err := s.rt.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil && !proxy.NotFound(err) {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			s.log.Error("checkpoint: removing what a failed RestorePod created", "sandbox", resp.PodSandboxId, "err", err)
			return proxy.Errorf(cause, "%s; removing what it created failed too: %v", proxy.Message(cause), err)
		}
		return cause
	}
	for _, e := range m.Containers {
		if err := ctx.Err(); err != nil {
			return nil, undo(proxy.Errorf(context.DeadlineExceeded, "RestorePod: deadline expired before container %q was created; everything the call created was removed", e.Name))
		}
		archive, err := layout.ArchivePath(dir, e)
		if err != nil {
			return nil, undo(proxy.Errorf(errdefs.ErrFailedPrecondition, "RestorePod: container %q: %v; everything the call created was removed", e.Name, err))
		}
		id, err := s.createRestored(rctx, resp.PodSandboxId, req.GetConfig(), byName[e.Name], e, archive)
		if err != nil {
			return nil, undo(proxy.Errorf(err, "RestorePod: restoring container %q: %s; everything the call created was removed", e.Name, proxy.Message(err)))
		}
		resp.RestoredContainers = append(resp.RestoredContainers, &runtimeapi.RestoredContainer{Name: e.Name, ContainerId: id})
	}
	if err := ctx.Err(); err != nil {
		return nil, undo(proxy.Errorf(context.DeadlineExceeded, "RestorePod: deadline expired; everything the call created was removed"))
	}
	// One entry per request entry, in the request's order.
	order := make(map[string]int, len(cfgs))
	for i, c := range cfgs {
		order[c.GetMetadata().GetName()] = i
	}
	slices.SortFunc(resp.RestoredContainers, func(a, b *runtimeapi.RestoredContainer) int { return order[a.Name] - order[b.Name] })
	return resp, nil
}

func names(m *layout.Manifest) []string {
	out := make([]string, len(m.Containers))
	for i, c := range m.Containers {
		out[i] = c.Name
	}
	return out
}
