package criu

// Warm restart: a pod that asks for it (WarmRestartAnnotation) has the
// containers of its in-place restarts (internal/podstate's replay) restored
// from its own latest checkpoint instead of started fresh. The checkpoint is
// one of this pod (same UID and namespace) under the checkpoint root, made
// by `cri-shim checkpoint`, CheckpointPod or a PodCheckpoint object, no older
// than the pod's maximum age. podstate falls back to a cold start, with an
// event saying why, when there is none or its restore fails.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	// WarmRestartAnnotation on a pod ("true") asks that its in-place
	// restarts start from its latest checkpoint.
	WarmRestartAnnotation = "checkpoint.cri-shim.io/warm-restart"
	// WarmRestartMaxAgeAnnotation bounds the age of that checkpoint (a Go
	// duration, 1s to 168h; default DefaultWarmRestartMaxAge): an older one
	// is stale and the restart is cold.
	WarmRestartMaxAgeAnnotation = "checkpoint.cri-shim.io/warm-restart-max-age"
	// DefaultWarmRestartMaxAge is the maximum age when the pod gives none.
	DefaultWarmRestartMaxAge = time.Hour
	maxWarmRestartMaxAge     = 7 * 24 * time.Hour
)

// ParseWarmRestart reads a pod's warm-restart annotations: whether it asks
// for warm restarts, and the oldest checkpoint it accepts. A value other
// than "true" or "false", or a malformed or out-of-range age, is an error
// naming the annotation (the restart is then cold, and the event says so).
func ParseWarmRestart(ann map[string]string) (bool, time.Duration, error) {
	v, ok := ann[WarmRestartAnnotation]
	if !ok {
		return false, 0, nil
	}
	switch strings.TrimSpace(v) {
	case "true":
	case "false", "":
		return false, 0, nil
	default:
		return false, 0, fmt.Errorf("%s: %q is not true or false", WarmRestartAnnotation, truncate(v, 32))
	}
	age := DefaultWarmRestartMaxAge
	if a, ok := ann[WarmRestartMaxAgeAnnotation]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(a))
		if err != nil || d < time.Second || d > maxWarmRestartMaxAge {
			return false, 0, fmt.Errorf("%s: %q is not a duration from 1s to %s", WarmRestartMaxAgeAnnotation, truncate(a, 32), maxWarmRestartMaxAge)
		}
		age = d
	}
	return true, age, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// WarmRestart is the create request that restores one container of a pod
// restarting in place from a checkpoint.
type WarmRestart struct {
	Request        *runtimeapi.CreateContainerRequest
	Checkpoint     string // its directory name under the root
	CheckpointedAt time.Time
	// Release ends the restore's use of the checkpoint (retention may
	// remove it from then on); call it once the container started or failed.
	Release func()
	// Created stages the restore of the container Request created (its
	// ID); on error the caller removes the container and starts it cold.
	// Nil when the container is not restored (it completed before the
	// checkpoint and runs as a no-op).
	Created func(id string) error
	// Started is called with StartContainer's result and returns the start's
	// result: an error too when the container started without its checkpoint
	// (restore_stage.go, finishRestore), which was then stopped.
	Started func(id string, err error) error
}

// errNoWarmCheckpoint: the pod asked for a warm restart and has no usable
// checkpoint; the message says why.
var errNoWarmCheckpoint = errors.New("no checkpoint to warm-restart from")

// WarmRestartRequest answers, for the cold create request of a container of a
// pod restarting in place, the request that restores it from the pod's
// latest good checkpoint. It is (nil, nil) when the pod did not ask for warm
// restarts or the checkpoint has nothing for this container, and an error
// saying why when it asked and none can be used. It reads only the
// checkpoint root (never the API server) and creates nothing.
func (s *Service) WarmRestartRequest(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*WarmRestart, error) {
	sb := req.GetSandboxConfig()
	on, maxAge, err := ParseWarmRestart(sb.GetAnnotations())
	if err != nil || !on {
		return nil, err
	}
	uid, ns := sb.GetMetadata().GetUid(), sb.GetMetadata().GetNamespace()
	name := req.GetConfig().GetMetadata().GetName()
	all, _ := List(s.cfg.Root)
	why := fmt.Errorf("%w: the pod has no checkpoint", errNoWarmCheckpoint)
	found := false
	for i := len(all) - 1; i >= 0; i-- { // newest first
		c := all[i]
		if uid == "" || c.Manifest.Pod.UID != uid || c.Manifest.Pod.Namespace != ns {
			continue
		}
		if age := s.now().Sub(c.Manifest.CheckpointedAt); age > maxAge {
			if !found {
				why = fmt.Errorf("%w: the pod's latest checkpoint %q is %s old, more than %s", errNoWarmCheckpoint, c.Name, age.Round(time.Second), maxAge)
			}
			break // the rest are older still
		}
		dir, err := confine(s.cfg.Root, c.Dir)
		if err != nil {
			continue
		}
		cfg, archive, _, err := s.warmConfig(ctx, req.GetConfig(), name, c.Name, dir, c.Manifest)
		if err != nil {
			if !found {
				why = fmt.Errorf("%w: %v", errNoWarmCheckpoint, err)
			}
			found = true
			continue // an older one may still be good
		}
		if cfg == nil {
			return nil, nil // the pod's checkpoint does not have this container: it starts fresh
		}
		r := proto.Clone(req).(*runtimeapi.CreateContainerRequest)
		r.Config = cfg
		s.mu.Lock()
		if s.restoring == nil {
			s.restoring = map[string]int{}
		}
		s.restoring[c.Dir]++ // keyed as retention lists it
		s.mu.Unlock()
		w := &WarmRestart{Request: r, Checkpoint: c.Name, CheckpointedAt: c.Manifest.CheckpointedAt, Release: s.releaser(c.Dir),
			Started: s.finishRestore}
		if archive != "" {
			logPath := containerLogPath(r.GetSandboxConfig(), cfg)
			sandbox, sb := req.GetPodSandboxId(), r.GetSandboxConfig()
			w.Created = func(id string) error {
				ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
				defer cancel()
				return s.stageRestore(ctx, sb, sandbox, id, archive, logPath)
			}
		}
		return w, nil
	}
	return nil, why
}

// releaser ends one restore's use of a checkpoint directory, once.
func (s *Service) releaser(dir string) func() {
	done := false
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if done {
			return
		}
		done = true
		if s.restoring[dir]--; s.restoring[dir] <= 0 {
			delete(s.restoring, dir)
		}
	}
}
