package criu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// RestoreFromAnnotation names, on a pod, the checkpoint (a directory name
// under the checkpoint root) its sandbox is warm-started from.
const RestoreFromAnnotation = "checkpoint.cri-shim.io/restore-from"

// CompletedMountPath is where a completed init container of a warm-started
// pod finds the shim's binary, which it runs instead of its own command.
const CompletedMountPath = "/.cri-shim/completed"

// warmPod is a sandbox the kubelet asked for with the restore-from
// annotation: its first container of each checkpointed name is restored.
type warmPod struct {
	SandboxID  string `json:"sandboxId"`
	Checkpoint string `json:"checkpoint"`
	Dir        string `json:"dir"`
	// Done are the container names already answered from the checkpoint;
	// later instances (restarts) start fresh.
	Done map[string]bool `json:"done"`
	m    *Manifest
}

func (s *Service) warmPath(sandboxID string) string {
	return filepath.Join(s.cfg.StateDir, "checkpoint", sandboxID+".warm.json")
}

func (s *Service) saveWarm(w *warmPod) error {
	return writeJSONAtomic(s.warmPath(w.SandboxID), w)
}

// loadWarm reads the warm starts an earlier shim left in progress.
func (s *Service) loadWarm() error {
	dir := filepath.Join(s.cfg.StateDir, "checkpoint")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".warm.json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var w warmPod
		if err == nil {
			err = json.Unmarshal(b, &w)
		}
		if err == nil {
			w.m, err = ReadManifest(w.Dir)
		}
		if err != nil {
			s.log.Error("checkpoint: dropping an unreadable warm-start record", "file", e.Name(), "err", err)
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		if w.Done == nil {
			w.Done = map[string]bool{}
		}
		s.warm[w.SandboxID] = &w
	}
	return nil
}

// Routes are the CRI calls the service serves or takes part in.
func (s *Service) Routes() []proxy.Route {
	active := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.warm) > 0
	}
	const svc = "/runtime.v1.RuntimeService/"
	return []proxy.Route{
		proxy.Unary(svc+"CheckpointPod", func(ctx context.Context, req *runtimeapi.CheckpointPodRequest, _ proxy.UnaryNext[runtimeapi.CheckpointPodRequest, runtimeapi.CheckpointPodResponse]) (*runtimeapi.CheckpointPodResponse, error) {
			return s.CheckpointPod(ctx, req)
		}),
		proxy.Unary(svc+"RestorePod", func(ctx context.Context, req *runtimeapi.RestorePodRequest, _ proxy.UnaryNext[runtimeapi.RestorePodRequest, runtimeapi.RestorePodResponse]) (*runtimeapi.RestorePodResponse, error) {
			return s.RestorePod(ctx, req)
		}),
		proxy.Unary(svc+"RunPodSandbox", s.runPodSandbox),
		proxy.UnaryIf(svc+"CreateContainer", active, s.createContainer),
		proxy.UnaryIf(svc+"RemovePodSandbox", active, s.removePodSandbox),
	}
}

// runPodSandbox warm-starts a sandbox whose pod names a checkpoint: the
// checkpoint is checked before the sandbox is created, so a missing or
// unusable one fails RunPodSandbox with a message the kubelet shows as an
// event, and the kubelet retries (the pod stays Pending).
func (s *Service) runPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	name, ok := req.GetConfig().GetAnnotations()[RestoreFromAnnotation]
	if !ok {
		return next(ctx, req)
	}
	fail := func(code codes.Code, format string, a ...any) error {
		s.metrics.warmStarts.WithLabelValues(code.String()).Inc()
		return status.Errorf(code, "cri-shim: %s %q: %s", RestoreFromAnnotation, name, fmt.Sprintf(format, a...))
	}
	if err := CheckName(name); err != nil {
		return nil, fail(codes.InvalidArgument, "%v", err)
	}
	dir, m, err := s.openCheckpoint(filepath.Join(s.cfg.Root, name))
	if err != nil {
		return nil, fail(status.Code(err), "%s; the pod stays pending and the kubelet retries", status.Convert(err).Message())
	}
	if err := checkHandler(m, req.GetRuntimeHandler()); err != nil {
		return nil, fail(codes.FailedPrecondition, "%s", status.Convert(err).Message())
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	w := &warmPod{SandboxID: resp.GetPodSandboxId(), Checkpoint: name, Dir: dir, Done: map[string]bool{}, m: m}
	if err := s.saveWarm(w); err != nil {
		s.log.Error("checkpoint: recording a warm start", "sandbox", w.SandboxID, "err", err)
	}
	s.mu.Lock()
	s.warm[w.SandboxID] = w
	s.mu.Unlock()
	s.metrics.warmStarts.WithLabelValues("success").Inc()
	md := req.GetConfig().GetMetadata()
	s.log.Info("checkpoint: warm-starting a pod from a checkpoint", "pod", md.GetNamespace()+"/"+md.GetName(),
		"sandbox", w.SandboxID, "checkpoint", name, "containers", len(m.Containers))
	return resp, nil
}

// createContainer answers the kubelet's first CreateContainer of each
// checkpointed name in a warm-started sandbox with the restored container,
// and runs a completed init container as a no-op that exits 0 at once.
func (s *Service) createContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	s.mu.Lock()
	w := s.warm[req.GetPodSandboxId()]
	name := req.GetConfig().GetMetadata().GetName()
	if w == nil || w.Done[name] {
		s.mu.Unlock()
		return next(ctx, req)
	}
	s.mu.Unlock()
	r := proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	how := ""
	if e, ok := w.m.Container(name); ok {
		if !s.imageMatches(ctx, req.GetConfig().GetImage(), e) {
			return nil, status.Errorf(codes.FailedPrecondition, "cri-shim: container %q: image %q is not the checkpointed image %q; checkpoint %q cannot warm-start it",
				name, req.GetConfig().GetImage().GetImage(), e.Image, w.Checkpoint)
		}
		r.Config = restoredConfig(req.GetConfig(), w.Dir, e)
		how = "restored"
	} else if x := w.exited(name); x != nil && x.ExitCode == 0 && s.cfg.ShimBinary != "" {
		c := r.Config
		c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: CompletedMountPath, HostPath: s.cfg.ShimBinary, Readonly: true})
		c.Command = []string{CompletedMountPath}
		c.Args = []string{"completed", name, w.Checkpoint}
		c.WorkingDir = "/"
		if restartCount(c.Annotations) < x.RestartCount {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[restartCountAnnotation] = strconv.Itoa(x.RestartCount)
		}
		how = "completed before the checkpoint; run as a no-op"
	} else {
		return next(ctx, req)
	}
	resp, err := next(ctx, r)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	w.Done[name] = true
	err = s.saveWarm(w)
	s.mu.Unlock()
	if err != nil {
		s.log.Error("checkpoint: recording a warm start", "sandbox", w.SandboxID, "err", err)
	}
	s.log.Info("checkpoint: warm start container", "sandbox", w.SandboxID, "container", name, "id", resp.GetContainerId(), "how", how)
	return resp, nil
}

func (w *warmPod) exited(name string) *ExitedEntry {
	for i := range w.m.Exited {
		if w.m.Exited[i].Name == name {
			return &w.m.Exited[i]
		}
	}
	return nil
}

func (s *Service) removePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if _, ok := s.warm[req.GetPodSandboxId()]; ok {
		delete(s.warm, req.GetPodSandboxId())
		os.Remove(s.warmPath(req.GetPodSandboxId()))
	}
	s.mu.Unlock()
	return resp, nil
}
