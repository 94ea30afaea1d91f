package restore

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restoremark"
	"github.com/cri-shim/cri-shim/internal/store"
)

// Config is what the service needs from the shim's configuration.
type Config struct {
	// Root confines every checkpoint path.
	Root string
	// Store tells the service when a sandbox is gone (its staged restores
	// are dropped).
	Store *store.Store
	// RestoreAcrossNamespaces widens the namespace binding of restores (see
	// Allowed): it reports whether pods of namespace to may restore
	// checkpoints of pods of namespace from. nil allows none.
	RestoreAcrossNamespaces func(from, to string) bool
	// PodEvent, when set, records an event on a pod (the API connection's
	// writer; never waits).
	PodEvent func(namespace, pod, uid, eventType, reason, action, note string)
	// RestoreMarks is where restores are marked for the runtime shim
	// (stage.go); the zero value is restoremark.Default().
	RestoreMarks restoremark.Dir
	// RootfsDiffMaxBytes bounds what a restored checkpoint's rootfs diff
	// may expand to ([checkpoint] pull_max_bytes, the largest checkpoint
	// the node takes); 0, or more than restoremark.MaxRootfsDiffBytes, is
	// that constant.
	RootfsDiffMaxBytes int64
	// ImageCheck replaces criucheck.Check of staged images (check.go);
	// nil is criucheck.Check. Tests whose archives hold no CRIU images set it.
	ImageCheck func(dir string, spec *specs.Spec) error
}

// Service serves RestorePod and stages and ends the restores of containers.
type Service struct {
	cfg   Config
	rt    runtimeapi.RuntimeServiceClient
	img   runtimeapi.ImageServiceClient
	tasks capture.Tasks
	log   *slog.Logger
	now   func() time.Time

	metrics *metrics

	mu sync.Mutex
	// staged holds the restores staged for containers not started yet,
	// by container ID, stagedN its size for HookActive (stage.go).
	staged  map[string]staged
	stagedN atomic.Int64
	// startedAt is when the service was built: containers created before
	// are an earlier shim's (removeUnmarked).
	startedAt time.Time
}

// The service serves RestorePod and ends restores at StartContainer.
var (
	_ proxy.RestorePodServer   = (*Service)(nil)
	_ proxy.StartContainerHook = (*Service)(nil)
	_ proxy.Activity           = (*Service)(nil)
)

// New builds the service. rt and img are the runtime's CRI clients
// (containerd), tasks its task service (the containers' specs).
func New(cfg Config, rt runtimeapi.RuntimeServiceClient, img runtimeapi.ImageServiceClient, tasks capture.Tasks, log *slog.Logger) *Service {
	s := &Service{cfg: cfg, rt: rt, img: img, tasks: tasks, log: log, now: time.Now, startedAt: time.Now(),
		metrics: newMetrics(), staged: map[string]staged{}}
	return s
}

// Collectors are the service's metrics.
func (s *Service) Collectors() []prometheus.Collector { return s.metrics.collectors() }

// HookActive: StartContainer only while a container staged for a restore
// awaits its start.
func (s *Service) HookActive(method proxy.Method) bool {
	if method == proxy.StartContainer {
		return s.stagedN.Load() > 0
	}
	return true
}

// StartContainer ends the restore of a staged container (Finish).
func (s *Service) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
	next proxy.UnaryNext[runtimeapi.StartContainerRequest, runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	resp, err := next(ctx, req)
	if err = s.Finish(req.GetContainerId(), err); err != nil {
		return nil, err
	}
	return resp, nil
}

// Recover takes up the restores a killed shim staged (recoverStaged), once
// at start before any call is served.
func (s *Service) Recover(ctx context.Context) { s.recoverStaged(ctx) }

// short is an ID's first 13 characters, for logs and messages.
func short(id string) string { return id[:min(len(id), 13)] }
