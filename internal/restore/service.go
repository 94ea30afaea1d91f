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
)

// Config is what the service needs from the shim's configuration.
type Config struct {
	// Root confines every checkpoint path.
	Root string
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
// Its errors are plain Go errors of a class the proxy maps to a gRPC code
// once, at its edge (proxy.Status): an errdefs kind, a context error, or the
// runtime's own gRPC status, passed on; the caller is shown the message.
type Service struct {
	cfg   Config
	rt    runtimeapi.RuntimeServiceClient
	img   runtimeapi.ImageServiceClient
	tasks capture.Tasks
	log   *slog.Logger
	now   func() time.Time

	// The metrics are named after KEP-5823's kubelet metrics, with the
	// shim's prefix.
	restores, restoreStarts, refusals *prometheus.CounterVec
	restoreTime                       prometheus.Histogram

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
	if cfg.RestoreMarks.Path == "" {
		cfg.RestoreMarks = restoremark.Default()
	}
	return &Service{cfg: cfg, rt: rt, img: img, tasks: tasks, log: log, now: time.Now, startedAt: time.Now(), staged: map[string]staged{},
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_restore_operations_total",
			Help: "RestorePod calls and warm starts served, by result.",
		}, []string{"result"}),
		restoreTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cri_shim_pod_restore_duration_seconds",
			Help:    "Duration of successful RestorePod calls (sandbox and containers created, not started).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}),
		restoreStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_restored_container_starts_total",
			Help: "Starts of containers staged for a restore, by result: restored; failed (the start failed); not_restored (started without the checkpoint: the pod's runtime is not cri-shim's runtime shim; stopped).",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_checkpoint_restores_refused_total",
			Help: "Restores refused because the checkpoint's CRIU images would give the container more than its spec allows, by the image kind of the first offending field (core: credentials, seccomp, namespaces; mounts; files; seccomp; ...), or because the checkpoint's rootfs changes are (rootfs_diff), or because a pulled checkpoint's archive or manifest is refused (archive).",
		}, []string{"image"}),
	}
}

// Collectors are the service's metrics.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.restores, s.restoreTime, s.restoreStarts, s.refusals}
}

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

// short is an ID's first 13 characters, for logs and messages.
func short(id string) string { return id[:min(len(id), 13)] }
