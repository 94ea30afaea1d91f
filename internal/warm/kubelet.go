package warm

// Warm restarts the kubelet drives: a pod asking for warm restarts
// (podspec.WarmRestartKey) whose container the kubelet itself starts again
// after a crash (its restartPolicy, no restart rule of cri-shim's) has that
// new instance restored from the pod's latest checkpoint, like the in-place
// restarts podstate carries out (restart.go). The kubelet's
// CreateContainer of an attempt above 0 is answered by the restored
// container; if its restore fails at StartContainer, the kubelet sees the
// start fail as with any container, and its next CreateContainer of that
// container starts cold.

import (
	"context"
	"strconv"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// pendingWarm is a container created from a checkpoint and not started yet.
type pendingWarm struct {
	sandbox, name string
	w             *restartapi.WarmStart
}

var _ proxy.StartContainerHook = (*Service)(nil)

// noteWarmRestartPod records a sandbox whose pod asks for warm restarts, so
// the CreateContainer hook is active for it. s.mu held.
func (s *Service) noteWarmRestartPod(sandboxID string, ann map[string]string) {
	if on, _, _ := podspec.ParseWarmRestart(ann); !on || sandboxID == "" {
		return
	}
	s.warmRestartPods[sandboxID] = true
	s.countHooked()
}

// Adopt finds, once at start, the sandboxes whose pods ask for warm
// restarts (the pod table's, synced before).
func (s *Service) Adopt() {
	sbs := s.cfg.Sandboxes.List(nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range sbs {
		s.noteWarmRestartPod(sb.ID, sb.Annotations)
	}
}

// kubeletWarmRestart answers the kubelet's CreateContainer of a restarted
// container of a pod asking for warm restarts.
func (s *Service) kubeletWarmRestart(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	sb, name := req.GetPodSandboxId(), req.GetConfig().GetMetadata().GetName()
	key := sb + "/" + name
	s.mu.Lock()
	cold := s.coldNext[key]
	delete(s.coldNext, key)
	s.mu.Unlock()
	if cold {
		return next(ctx, req)
	}
	w, err := s.WarmRestartRequest(ctx, req)
	if err != nil {
		s.kubeletWarmCold(req, err.Error())
		return next(ctx, req)
	}
	if w == nil {
		return next(ctx, req)
	}
	resp, err := next(ctx, w.Request)
	if err != nil {
		w.Release()
		s.kubeletWarmCold(req, "creating the container from checkpoint "+w.Checkpoint+" failed: "+err.Error())
		return next(ctx, req)
	}
	if w.Created != nil {
		if err := w.Created(resp.GetContainerId()); err != nil {
			w.Release()
			s.undoUnrecorded("container", resp.GetContainerId(), func(ctx context.Context) error {
				_, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.GetContainerId()})
				return err
			})
			s.kubeletWarmCold(req, "staging the restore from checkpoint "+w.Checkpoint+" failed: "+err.Error())
			return next(ctx, req)
		}
	}
	s.mu.Lock()
	s.pendingWarm[resp.GetContainerId()] = pendingWarm{sandbox: sb, name: name, w: w}
	s.countHooked()
	s.mu.Unlock()
	return resp, nil
}

// StartContainer ends a kubelet-driven warm restart: a restore that fails
// at start (next is internal/restore's hook, which ends the restore) makes
// the kubelet's next create of the container cold.
func (s *Service) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
	next proxy.UnaryNext[runtimeapi.StartContainerRequest, runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	s.mu.Lock()
	p, ok := s.pendingWarm[req.GetContainerId()]
	delete(s.pendingWarm, req.GetContainerId())
	s.countHooked()
	s.mu.Unlock()
	resp, err := next(ctx, req)
	if !ok {
		return resp, err
	}
	p.w.Release()
	sbCfg := p.w.Request.GetSandboxConfig()
	if err != nil {
		s.mu.Lock()
		s.coldNext[p.sandbox+"/"+p.name] = true
		s.mu.Unlock()
		s.kubeletWarmCold(p.w.Request, "restoring from checkpoint "+p.w.Checkpoint+" failed: "+proxy.Message(err)+"; its next start is cold")
		return resp, err
	}
	age := s.now().Sub(p.w.CheckpointedAt).Round(time.Second)
	s.kubeletWarm.WithLabelValues("restored").Inc()
	s.log.Info("checkpoint: container the kubelet restarted was restored from its pod's checkpoint",
		"pod", sbCfg.GetMetadata().GetNamespace()+"/"+sbCfg.GetMetadata().GetName(), "container", p.name, "checkpoint", p.w.Checkpoint, "age", age)
	s.restore.PodEvent(sbCfg, "Normal", "WarmRestarted", "Restore ("+p.name+")", "container "+p.name+" restored from checkpoint "+p.w.Checkpoint+", taken "+age.String()+" before")
	return resp, nil
}

func (s *Service) kubeletWarmCold(req *runtimeapi.CreateContainerRequest, why string) {
	sb, name := req.GetSandboxConfig(), req.GetConfig().GetMetadata().GetName()
	s.kubeletWarm.WithLabelValues("cold").Inc()
	s.log.Warn("checkpoint: warm restart not possible; the kubelet's restart of the container starts cold",
		"pod", sb.GetMetadata().GetNamespace()+"/"+sb.GetMetadata().GetName(), "container", name,
		"attempt", strconv.Itoa(int(req.GetConfig().GetMetadata().GetAttempt())), "why", why)
	s.restore.PodEvent(sb, "Warning", "WarmRestartFallback", "Cold start ("+name+")", "container "+name+" started cold: "+why)
}

// forgetWarmRestart drops what the service keeps of a removed sandbox's
// warm restarts; it returns the releases of the checkpoints its pending
// restores held, to be called once s.mu is released. s.mu held.
func (s *Service) forgetWarmRestart(sandboxID string) []func() {
	delete(s.warmRestartPods, sandboxID)
	var release []func()
	for id, p := range s.pendingWarm {
		if p.sandbox == sandboxID {
			release = append(release, p.w.Release)
			delete(s.pendingWarm, id)
		}
	}
	for k := range s.coldNext {
		if strings.HasPrefix(k, sandboxID+"/") {
			delete(s.coldNext, k)
		}
	}
	return release
}
