package criu

import (
	"context"
	"fmt"
	"github.com/opencontainers/runtime-spec/specs-go"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restoremark"
	"github.com/cri-shim/cri-shim/internal/store"
)

// Config is what the service needs from the shim's configuration.
type Config struct {
	// Root confines every checkpoint path.
	Root string
	// StateDir holds the service's crash-recovery records of checkpoint
	// calls (stateDir/checkpoint).
	StateDir string
	// Store holds the warm-start records (bucket "warm", one per sandbox)
	// and tells the service when a sandbox is gone.
	Store *store.Store
	// Sandboxes are the node's sandboxes (the pod table), read by the
	// checkpoint schedule and to find the pods asking for warm restarts.
	Sandboxes interface {
		List(keep func(*podtable.Sandbox) bool) []podtable.Sandbox
	}
	// MaxPerPod and MaxTotalBytes are the retention of managed checkpoints (0: unbounded).
	MaxPerPod     int
	MaxTotalBytes int64
	// MaxBytesPerNamespace bounds the managed checkpoints of each namespace (0: unbounded).
	MaxBytesPerNamespace int64
	// MinInterval is the shortest schedule a pod's podspec.IntervalKey gets (schedule.go).
	MinInterval time.Duration
	// MaxConcurrentCaptures bounds the captures running at once (0:
	// unbounded) and PodMinGap the time between the starts of two
	// checkpoints of a pod (0: none); admission.go.
	MaxConcurrentCaptures int
	PodMinGap             time.Duration
	// ContainerMemory, when set, is the memory of a container a capture
	// writes (capture.ContainerdTasks.DumpableMemory); nil: the CRI's
	// memory working set and swap, which count the file cache too.
	ContainerMemory func(ctx context.Context, id string) (uint64, error)
	// ShimBinary is the shim's own executable, mounted into a warm-started
	// init container that had completed, so that it completes again at once
	// without running its image's code (see warm.go). Empty disables that.
	ShimBinary string
	// CRIUVersion reports the CRIU version for manifests; nil leaves it "unknown".
	CRIUVersion func() (string, error)
	// RestoreAcrossNamespaces widens the namespace binding of restores (see
	// restoreAllowed): it reports whether pods of namespace to may restore
	// checkpoints of pods of namespace from. nil allows none.
	RestoreAcrossNamespaces func(from, to string) bool
	// ResolveRestore, when set, is asked for the checkpoint directory of a
	// restore-from name that is no directory under Root: a PodCheckpoint
	// object of the pod's namespace (internal/podcheckpoint). It answers
	// from memory, waiting for a background read of the API server only a
	// bounded time within ctx's deadline, with the directory's name under
	// Root, or an error the pod's RunPodSandbox fails with
	// (FailedPrecondition, or Unavailable when the error is of that class:
	// the answer is not in yet). It may answer with an image reference
	// instead (a PodCheckpoint whose spec names one), which is then pulled
	// as if the pod named it.
	ResolveRestore func(ctx context.Context, namespace, pod, uid, name string) (string, error)
	// PodEvent, when set, records an event on a pod (the API connection's
	// writer; never waits).
	PodEvent func(namespace, pod, uid, eventType, reason, action, note string)
	// PullRestore, when set, is asked for the checkpoint of a restore-from
	// image reference (internal/ociartifact's RestorePuller): it returns
	// the directory under Root it pulled it into (layout.PulledDirPrefix), or an
	// error of an errdefs class (layout.ErrForeignCheckpoint: refused by the
	// namespace binding). It waits for a pull only a bounded time, and asks
	// reserve for room for the archive bytes it fetches (ReservePulled: the
	// cap on pulled checkpoints is the service's, which knows the pods
	// using them). nil refuses image references.
	PullRestore func(ctx context.Context, namespace, pod, uid, ref string, reserve func(total int64) (release func(), err error)) (string, error)
	// StreamDuringCapture, CaptureTiming and Captures are
	// internal/capture's Config fields of those names.
	StreamDuringCapture bool
	CaptureTiming       capture.Timing
	Captures            capture.CaptureWatch
	// PullMaxTotalBytes bounds the pulled checkpoints on the node together,
	// those being pulled included (ReservePulled); 0: unbounded.
	PullMaxTotalBytes int64
	// RestoreMarks is where restores are marked for the runtime shim
	// (restore_stage.go); the zero value is restoremark.Default().
	RestoreMarks restoremark.Dir
	// RootfsDiffMaxBytes bounds what a restored checkpoint's rootfs diff
	// may expand to ([checkpoint] pull_max_bytes, the largest checkpoint
	// the node takes); 0, or more than restoremark.MaxRootfsDiffBytes, is
	// that constant.
	RootfsDiffMaxBytes int64
}

// Service serves CheckpointPod and RestorePod and the warm-start routes.
type Service struct {
	cfg   Config
	rt    runtimeapi.RuntimeServiceClient
	img   runtimeapi.ImageServiceClient
	tasks capture.Tasks
	log   *slog.Logger
	now   func() time.Time

	metrics *metrics
	// adm is the admission of checkpoints before their pause, overhead
	// what its estimate adds per container (admission.go).
	adm      *admission
	overhead int64

	// capture serves CheckpointPod (internal/capture); its checkpoints
	// are retained by this service (retain).
	capture *capture.Service

	// warmRecs holds the records of warm (warm.go).
	warmRecs *store.Bucket

	mu   sync.Mutex
	warm map[string]*warmPod // sandbox ID -> warm start in progress
	// restoring counts the warm restarts reading each checkpoint directory
	// (warm_restart.go); retention leaves those alone.
	restoring map[string]int
	// warmRestartPods are the sandboxes whose pods ask for warm restarts;
	// pendingWarm the containers created from a checkpoint for the kubelet
	// and not started yet (by ID); coldNext the sandbox/name whose restore
	// failed, created cold next (warm_kubelet.go).
	warmRestartPods map[string]bool
	pendingWarm     map[string]pendingWarm
	coldNext        map[string]bool
	// pullReserved is the archive bytes of the pulls in progress, and
	// pinnedPulled the pulled checkpoints a RunPodSandbox is starting a
	// pod from (pulledcap.go).
	pullReserved int64
	pinnedPulled map[string]int
	// removing holds the pulled checkpoints renamed away that this shim
	// is deleting now (pulled.go); the sweep takes any other.
	removing map[string]bool
	// staged holds the restores staged for containers not started yet,
	// by container ID, stagedN its size for HookActive
	// (restore_stage.go).
	staged  map[string]staged
	stagedN atomic.Int64
	// createHooked counts the sandboxes whose CreateContainer the service
	// rewrites (warm starts, warm-restart pods) and pendingN the warm
	// restarts waiting for their start, for HookActive; both set under
	// s.mu by countHooked.
	createHooked, pendingN atomic.Int64
	// imageCheck replaces criucheck.Check of staged images in tests
	// whose archives hold no CRIU images (restore_check.go).
	imageCheck func(dir string, spec *specs.Spec) error
	// startedAt is when the service was built: containers created before
	// are an earlier shim's (removeUnmarked).
	startedAt time.Time
}

// New builds the service. rt and img are the runtime's CRI clients
// (containerd), tasks its task service. The checkpoint root and state
// directory are created.
func New(cfg Config, rt runtimeapi.RuntimeServiceClient, img runtimeapi.ImageServiceClient, tasks capture.Tasks, log *slog.Logger) (*Service, error) {
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "checkpoint"), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	s := &Service{
		cfg: cfg, rt: rt, img: img, tasks: tasks, log: log, now: time.Now, startedAt: time.Now(),
		metrics:  newMetrics(),
		adm:      newAdmission(cfg.MaxConcurrentCaptures),
		overhead: estimateOverhead,
		warm:     make(map[string]*warmPod),
	}
	c, err := capture.New(capture.Config{Root: cfg.Root, StateDir: cfg.StateDir, StreamDuringCapture: cfg.StreamDuringCapture,
		CRIUVersion: cfg.CRIUVersion, Retain: s.retain, Admit: s.admit, Timing: cfg.CaptureTiming, Captures: cfg.Captures}, rt, img, tasks, log)
	if err != nil {
		return nil, err
	}
	s.capture = c
	s.retireLeftoverPulls()
	if err := s.loadWarm(); err != nil {
		return nil, err
	}
	cfg.Store.Subscribe(s.forgetWarm)
	return s, nil
}

// Collectors are the service's metrics, its captures' included.
func (s *Service) Collectors() []prometheus.Collector {
	return append(append(s.metrics.collectors(), s.capture.Collectors()...), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cri_shim_pulled_checkpoint_bytes",
		Help: "Bytes of the checkpoints pulled from registries for restores (oci- directories) on this node.",
	}, func() float64 { return float64(s.PulledBytes()) }))
}

// CheckpointPod serves the CRI call (internal/capture).
func (s *Service) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	return s.capture.CheckpointPod(ctx, req)
}

// Run recovers from a crash of an earlier shim (restores it had staged, pods
// it had frozen, its unfinished checkpoints) and keeps retrying resumes that
// failed, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	s.adoptWarmRestartPods()
	s.recoverStaged(ctx)
	s.capture.Recover(ctx)
	s.capture.RetryResumes(ctx)
}

// short is an ID's first 13 characters, for logs and messages.
func short(id string) string { return id[:min(len(id), 13)] }
