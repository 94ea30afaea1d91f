package restore

// Before a restore is staged for the runtime shim, its CRIU images and its
// rootfs diff are checked against the container the runtime created for it
// (internal/criucheck): the container's OCI spec, read from containerd, is
// what the pod's CreateContainer config made. A checkpoint that would give
// the restored processes more than that spec (capabilities, users, seccomp,
// namespaces, mounts, devices, files; in the diff, set-user-ID files, device
// nodes, file capabilities, owners) is refused here, with the first
// offending field, an event on the pod and a metric; the runtime shim
// checks again at task create, against the bundle's config.json
// (internal/runtimeshim), so a restore that bypassed this check is refused
// there too.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// checkStaged checks the staged images in dir and rootfs diff (diff, "" for
// none) of container id against its spec; sb is its sandbox's config, for
// the event.
func (s *Service) checkStaged(ctx context.Context, sb *runtimeapi.PodSandboxConfig, id, dir, diff string) error {
	info, err := s.tasks.Info(ctx, id)
	if err != nil {
		return fmt.Errorf("reading the container's runtime spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(info.Spec, &spec); err != nil {
		return fmt.Errorf("the container's runtime spec: %w", err)
	}
	check := s.cfg.ImageCheck
	if check == nil {
		check = func(dir string, spec *specs.Spec) error { return criucheck.Check(dir, spec, criucheck.Options{}) }
	}
	err = check(dir, &spec)
	if err == nil && diff != "" {
		err = criucheck.CheckRootfsDiff(diff, &spec, s.rootfsDiffMax())
	}
	var r *criucheck.Refusal
	if errors.As(err, &r) {
		s.refusals.WithLabelValues(criucheck.RefusalKind(r.Image)).Inc()
		s.log.Warn("checkpoint: restore refused", "container", id, "image", r.Image, "field", r.Field, "reason", r.Reason)
		s.PodEvent(sb, "Warning", "CheckpointRefused", "Restore", r.Error())
	}
	return err
}

// rootfsDiffMax bounds a staged rootfs diff's expanded size, here and, by
// the mark, in the runtime shim.
func (s *Service) rootfsDiffMax() int64 {
	return restoremark.RootfsDiffLimit(s.cfg.RootfsDiffMaxBytes)
}

// RefusedArchive counts and logs the refusal of the pulled checkpoint ref
// (err: its archive or manifest) a pod of sandbox config sb names, and tells
// the pod.
func (s *Service) RefusedArchive(sb *runtimeapi.PodSandboxConfig, ref string, err error) {
	md := sb.GetMetadata()
	s.refusals.WithLabelValues("archive").Inc()
	s.log.Warn("checkpoint: pulled checkpoint refused", "pod", md.GetNamespace()+"/"+md.GetName(), "ref", ref, "err", err)
	s.PodEvent(sb, "Warning", "CheckpointRefused", "Restore", proxy.Message(err))
}
