package capture

import (
	"context"
	"slices"
	"strconv"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// RestartCountAnnotation is the kubelet's annotation of a container's
// restart count, which a checkpoint records and a restore gives back.
const RestartCountAnnotation = "io.kubernetes.container.restartCount"

// selectTargets checks that every requested container is a running container
// of the sandbox, and collects the pod's exited containers (completed init
// containers) for the manifest.
func (s *Service) selectTargets(ctx context.Context, sandboxID string, ids []string) ([]target, []layout.ExitedEntry, error) {
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
			return nil, nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: container %q is not a container of sandbox %s", id, short(sandboxID))
		}
		name := c.GetMetadata().GetName()
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			return nil, nil, errorf(errdefs.ErrFailedPrecondition, "CheckpointPod: container %s (%s) is %s; only running containers can be checkpointed", short(id), name, c.GetState())
		}
		if err := layout.CheckContainerName(name); err != nil {
			return nil, nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: container %s: %v", short(id), err)
		}
		if names[name] {
			return nil, nil, errorf(errdefs.ErrInvalidArgument, "CheckpointPod: two selected containers are named %q", name)
		}
		names[name] = true
		st, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return nil, nil, err
		}
		info, err := s.tasks.Info(ctx, id)
		if err != nil {
			return nil, nil, errorf(errdefs.ErrInternal, "CheckpointPod: container %s (%s): reading containerd's record: %v", short(id), name, err)
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
	var exited []layout.ExitedEntry
	for n, c := range latest {
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || layout.CheckContainerName(n) != nil {
			continue
		}
		st, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err != nil {
			continue // removed meanwhile: not part of the cut
		}
		exited = append(exited, layout.ExitedEntry{Name: n, ExitCode: st.GetStatus().GetExitCode(),
			RestartCount: RestartCount(st.GetStatus().GetAnnotations()), Image: st.GetStatus().GetImage().GetImage()})
	}
	slices.SortFunc(exited, func(a, b layout.ExitedEntry) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return targets, exited, nil
}

// RestartCount is the restart count a container's annotations record (0 for none).
func RestartCount(ann map[string]string) int {
	n, err := strconv.Atoi(ann[RestartCountAnnotation])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// ImageID asks the runtime for the ID of an image name; "" if it has none.
func ImageID(ctx context.Context, img runtimeapi.ImageServiceClient, name string) string {
	if img == nil || name == "" {
		return ""
	}
	r, err := img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
	if err != nil {
		return ""
	}
	return r.GetImage().GetId()
}
