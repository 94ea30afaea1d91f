package criu

import (
	"context"
	"errors"

	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RestorePod serves the CRI call (KEP-5823): a new sandbox from req.Config and
// one CREATED container per checkpointed container; StartContainer on each
// then restores its processes (containerd restores a container whose image is
// a checkpoint archive).
func (s *Service) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	start := s.now()
	resp, err := s.restorePod(ctx, req)
	if err != nil {
		s.metrics.restores.WithLabelValues(status.Code(err).String()).Inc()
		s.log.Warn("checkpoint: RestorePod failed", "path", req.GetCheckpointPath(), "err", err)
		return nil, err
	}
	d := s.now().Sub(start)
	s.metrics.restores.WithLabelValues("success").Inc()
	s.metrics.restoreTime.Observe(d.Seconds())
	md := req.GetConfig().GetMetadata()
	s.log.Info("checkpoint: pod restored (containers created)", "pod", md.GetNamespace()+"/"+md.GetName(),
		"sandbox", resp.PodSandboxId, "containers", len(resp.RestoredContainers), "seconds", d.Seconds())
	return resp, nil
}

// openCheckpoint confines and reads a checkpoint directory.
func (s *Service) openCheckpoint(p string) (string, *Manifest, error) {
	dir, err := confine(s.cfg.Root, p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !errors.Is(err, errOutsideRoot) {
			return "", nil, status.Errorf(codes.NotFound, "checkpoint: %v", err)
		}
		return "", nil, status.Errorf(codes.InvalidArgument, "checkpoint path: %v", err)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return "", nil, status.Errorf(codes.FailedPrecondition, "checkpoint: %v", err)
	}
	for _, c := range m.Containers {
		if _, err := os.Stat(filepath.Join(dir, c.Archive)); err != nil {
			return "", nil, status.Errorf(codes.FailedPrecondition, "checkpoint %s: container %q: %v", dir, c.Name, err)
		}
	}
	return dir, m, nil
}

// checkHandler refuses a runtime handler other than the checkpoint's.
func checkHandler(m *Manifest, handler string) error {
	if handler != m.Pod.RuntimeHandler {
		return status.Errorf(codes.FailedPrecondition, "runtime handler %q cannot restore a checkpoint taken under handler %q", handler, m.Pod.RuntimeHandler)
	}
	return nil
}

// imageMatches reports whether a restore-time image is the checkpointed one:
// the same name or reference, or a name the runtime resolves to the same
// image ID (one image often has several names).
func (s *Service) imageMatches(ctx context.Context, spec *runtimeapi.ImageSpec, e ContainerEntry) bool {
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
	id := s.imageID(ctx, img)
	return id != "" && id == e.ImageID
}

// imageID asks the runtime for the ID of an image name; "" if it has none.
func (s *Service) imageID(ctx context.Context, name string) string {
	if s.img == nil || name == "" {
		return ""
	}
	r, err := s.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
	if err != nil {
		return ""
	}
	return r.GetImage().GetId()
}

// restoredConfig is cfg with the checkpoint archive as its image, so that
// containerd restores it, and the checkpoint's restart count.
func restoredConfig(cfg *runtimeapi.ContainerConfig, dir string, e ContainerEntry) *runtimeapi.ContainerConfig {
	c := proto.Clone(cfg).(*runtimeapi.ContainerConfig)
	c.Image = &runtimeapi.ImageSpec{Image: filepath.Join(dir, e.Archive), UserSpecifiedImage: e.Image}
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	if restartCount(c.Annotations) < e.RestartCount {
		c.Annotations[restartCountAnnotation] = strconv.Itoa(e.RestartCount)
	}
	return c
}

// restoreTimeout bounds the runtime calls of one RestorePod, whatever the
// caller's deadline (see restorePod).
const restoreTimeout = 4 * time.Minute

func (s *Service) restorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, status.Error(codes.InvalidArgument, "RestorePod: the call has no deadline; the CRI contract requires one")
	}
	if err := parseRestoreOptions(req.GetOptions()); err != nil {
		return nil, status.Error(codes.InvalidArgument, "RestorePod: "+err.Error())
	}
	if req.GetConfig() == nil {
		return nil, status.Error(codes.InvalidArgument, "RestorePod: config (the new sandbox's configuration) is missing")
	}
	dir, m, err := s.openCheckpoint(req.GetCheckpointPath())
	if err != nil {
		return nil, status.Error(status.Code(err), "RestorePod: "+status.Convert(err).Message())
	}
	cfgs := req.GetContainerConfigs()
	if len(cfgs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "RestorePod: container_configs is empty")
	}
	byName := make(map[string]*runtimeapi.ContainerConfig, len(cfgs))
	for i, c := range cfgs {
		n := c.GetMetadata().GetName()
		if n == "" {
			return nil, status.Errorf(codes.InvalidArgument, "RestorePod: container_configs[%d] has no metadata name", i)
		}
		if byName[n] != nil {
			return nil, status.Errorf(codes.InvalidArgument, "RestorePod: container %q is configured twice", n)
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
		return nil, status.Errorf(codes.InvalidArgument, "RestorePod: container names must be exactly the checkpoint's %v: missing %v, not in the checkpoint %v",
			names(m), missing, extra)
	}
	for _, e := range m.Containers {
		if img := byName[e.Name].GetImage(); !s.imageMatches(ctx, img, e) {
			return nil, status.Errorf(codes.InvalidArgument, "RestorePod: container %q: image %q is not the checkpointed image %q (%s)", e.Name, img.GetImage(), e.Image, e.ImageRef)
		}
	}
	if err := checkHandler(m, req.GetRuntimeHandler()); err != nil {
		return nil, status.Error(codes.FailedPrecondition, "RestorePod: "+status.Convert(err).Message())
	}

	// The runtime's calls run to completion whatever the caller's deadline,
	// so that the service knows what exists and can remove it on failure.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
	defer cancel()
	sb, err := s.rt.RunPodSandbox(rctx, &runtimeapi.RunPodSandboxRequest{Config: req.GetConfig(), RuntimeHandler: req.GetRuntimeHandler()})
	if err != nil {
		return nil, status.Errorf(status.Code(err), "RestorePod: creating the sandbox: %s", status.Convert(err).Message())
	}
	resp := &runtimeapi.RestorePodResponse{PodSandboxId: sb.GetPodSandboxId()}
	undo := func(cause error) error {
		var errs []error
		for _, rc := range resp.RestoredContainers {
			if _, err := s.rt.RemoveContainer(rctx, &runtimeapi.RemoveContainerRequest{ContainerId: rc.ContainerId}); err != nil && !isNotFound(err) {
				errs = append(errs, err)
			}
		}
		if _, err := s.rt.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil && !isNotFound(err) {
			errs = append(errs, err)
		}
		if _, err := s.rt.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil && !isNotFound(err) {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			s.log.Error("checkpoint: removing what a failed RestorePod created", "sandbox", resp.PodSandboxId, "err", err)
			return status.Errorf(status.Code(cause), "%s; removing what it created failed too: %v", status.Convert(cause).Message(), err)
		}
		return cause
	}
	for _, e := range m.Containers {
		if err := ctx.Err(); err != nil {
			return nil, undo(status.Errorf(codes.DeadlineExceeded, "RestorePod: deadline expired before container %q was created; everything the call created was removed", e.Name))
		}
		cr, err := s.rt.CreateContainer(rctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId: resp.PodSandboxId, Config: restoredConfig(byName[e.Name], dir, e), SandboxConfig: req.GetConfig(),
		})
		if err != nil {
			return nil, undo(status.Errorf(status.Code(err), "RestorePod: restoring container %q: %s; everything the call created was removed", e.Name, status.Convert(err).Message()))
		}
		resp.RestoredContainers = append(resp.RestoredContainers, &runtimeapi.RestoredContainer{Name: e.Name, ContainerId: cr.GetContainerId()})
	}
	if err := ctx.Err(); err != nil {
		return nil, undo(status.Error(codes.DeadlineExceeded, "RestorePod: deadline expired; everything the call created was removed"))
	}
	// One entry per request entry, in the request's order.
	order := make(map[string]int, len(cfgs))
	for i, c := range cfgs {
		order[c.GetMetadata().GetName()] = i
	}
	slices.SortFunc(resp.RestoredContainers, func(a, b *runtimeapi.RestoredContainer) int { return order[a.Name] - order[b.Name] })
	return resp, nil
}

func names(m *Manifest) []string {
	out := make([]string, len(m.Containers))
	for i, c := range m.Containers {
		out[i] = c.Name
	}
	return out
}
