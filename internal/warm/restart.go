package warm

// Warm restart: a pod that asks for it (podspec.WarmRestartKey) has the
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
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckptstore"
	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restore"
)

// errNoWarmCheckpoint: the pod asked for a warm restart and has no usable
// checkpoint; the message says why.
var errNoWarmCheckpoint = errors.New("no checkpoint to warm-restart from")

// WarmRestartRequest answers, for the cold create request of a container of a
// pod restarting in place, the request that restores it from the pod's
// latest good checkpoint. It is (nil, nil) when the pod did not ask for warm
// restarts or the checkpoint has nothing for this container, and an error
// saying why when it asked and none can be used. It reads only the
// checkpoint root (never the API server) and creates nothing.
func (s *Service) WarmRestartRequest(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*restartapi.WarmStart, error) {
	sb := req.GetSandboxConfig()
	on, maxAge, err := podspec.ParseWarmRestart(sb.GetAnnotations())
	if err != nil || !on {
		return nil, err
	}
	uid, ns := sb.GetMetadata().GetUid(), sb.GetMetadata().GetNamespace()
	name := req.GetConfig().GetMetadata().GetName()
	all, _ := ckptstore.List(s.cfg.Root)
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
		dir, err := layout.Confine(s.cfg.Root, c.Dir)
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
		// c.Dir is keyed as retention lists it.
		w := &restartapi.WarmStart{Request: r, Checkpoint: c.Name, CheckpointedAt: c.Manifest.CheckpointedAt, Release: s.ckpts.Use(c.Dir),
			Started: s.restore.Finish}
		if archive != "" {
			logPath := restore.ContainerLogPath(r.GetSandboxConfig(), cfg)
			sandbox, sb := req.GetPodSandboxId(), r.GetSandboxConfig()
			w.Created = func(id string) error {
				ctx, cancel := context.WithTimeout(context.Background(), restore.Timeout)
				defer cancel()
				refused := func(rf *criucheck.Refusal) { s.refuseWarm(sandbox, short(id), rf) }
				return s.restore.Stage(ctx, sb, sandbox, id, archive, logPath, refused)
			}
		}
		return w, nil
	}
	return nil, why
}
