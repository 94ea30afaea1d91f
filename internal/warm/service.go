package warm

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restore"
	"github.com/cri-shim/cri-shim/internal/store"
)

// Config is what the service needs from the shim's configuration.
type Config struct {
	// Root holds the checkpoints.
	Root string
	// Store holds the warm-start records (bucket "warm", one per sandbox)
	// and tells the service when a sandbox is gone.
	Store *store.Store
	// Sandboxes are the node's sandboxes (the pod table), read to find the
	// pods asking for warm restarts.
	Sandboxes *podtable.Table
	// ShimBinary is the shim's own executable, mounted into a warm-started
	// init container that had completed, so that it completes again at once
	// without running its image's code (see warm.go). Empty disables that.
	ShimBinary string
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
	// PullRestore, when set, is asked for the checkpoint of a restore-from
	// image reference (internal/ociartifact's RestorePuller): it returns
	// the directory under Root it pulled it into (layout.PulledDirPrefix), or an
	// error of an errdefs class (layout.ErrForeignCheckpoint: refused by the
	// namespace binding). It waits for a pull only a bounded time, and asks
	// reserve for room for the archive bytes it fetches (the store's
	// ReservePulled: the cap on pulled checkpoints is the store's, which
	// knows the pods using them). nil refuses image references.
	PullRestore func(ctx context.Context, namespace, pod, uid, ref string, reserve func(total int64) (release func(), err error)) (string, error)
}

// Checkpoints is what warm starts and warm restarts use of the node's
// checkpoint store (internal/ckptstore): its ledger of the checkpoints in
// use and the cap on pulled ones.
type Checkpoints interface {
	Use(dir string) (release func())
	ReleasePulled(dir string)
	PinPulled(name string) (unpin func())
	ReservePulled(n int64) (release func(), err error)
}

// Service serves warm starts and warm restarts.
type Service struct {
	cfg     Config
	rt      runtimeapi.RuntimeServiceClient
	restore *restore.Service
	ckpts   Checkpoints
	log     *slog.Logger
	now     func() time.Time

	// warmStarts and kubeletWarm are the service's metrics.
	warmStarts, kubeletWarm *prometheus.CounterVec

	// warmRecs holds the records of warm (records.go).
	warmRecs *store.Bucket

	mu   sync.Mutex
	warm map[string]*warmPod // sandbox ID -> warm start in progress
	// warmRestartPods are the sandboxes whose pods ask for warm restarts;
	// pendingWarm the containers created from a checkpoint for the kubelet
	// and not started yet (by ID); coldNext the sandbox/name whose restore
	// failed, created cold next (kubelet.go).
	warmRestartPods map[string]bool
	pendingWarm     map[string]pendingWarm
	coldNext        map[string]bool
	// createHooked counts the sandboxes whose CreateContainer the service
	// rewrites (warm starts, warm-restart pods) and pendingN the warm
	// restarts waiting for their start, for HookActive; both set under
	// s.mu by countHooked.
	createHooked, pendingN atomic.Int64
}

// New builds the service, with the warm starts an earlier shim left in
// progress. rt is the runtime's CRI client (containerd), rs the restores.
func New(cfg Config, rt runtimeapi.RuntimeServiceClient, rs *restore.Service, ckpts Checkpoints, log *slog.Logger) (*Service, error) {
	s := &Service{cfg: cfg, rt: rt, restore: rs, ckpts: ckpts, log: log, now: time.Now, warm: make(map[string]*warmPod),
		warmRestartPods: map[string]bool{}, pendingWarm: map[string]pendingWarm{}, coldNext: map[string]bool{},
		warmStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_warm_starts_total",
			Help: "Sandboxes the kubelet asked for with the restore-from annotation, by result.",
		}, []string{"result"}),
		kubeletWarm: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_kubelet_warm_restarts_total",
			Help: "Containers the kubelet restarted in pods asking for warm restarts, by result: restored from the pod's checkpoint, or cold.",
		}, []string{"result"}),
	}
	if err := s.loadWarm(); err != nil {
		return nil, err
	}
	return s, nil
}

// Collectors are the service's metrics.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.warmStarts, s.kubeletWarm}
}

// short is an ID's first 13 characters, for logs and messages.
func short(id string) string { return id[:min(len(id), 13)] }
