package ckptstore

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podtable"
)

// Config is what the store needs from the shim's configuration.
type Config struct {
	// Root holds the checkpoints.
	Root string
	// Sandboxes are the node's sandboxes (the pod table), read by the
	// checkpoint schedule.
	Sandboxes *podtable.Table
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
	// PullMaxTotalBytes bounds the pulled checkpoints on the node together,
	// those being pulled included (ReservePulled); 0: unbounded.
	PullMaxTotalBytes int64
}

// Store is the node's checkpoint store.
type Store struct {
	cfg Config
	rt  runtimeapi.RuntimeServiceClient
	log *slog.Logger
	now func() time.Time

	// The store's metrics (their Help, in New, says what each counts).
	scheduled, admissionRefused                   *prometheus.CounterVec
	retentionRemove, pulledEvicted, pulledRefused prometheus.Counter
	pulledReserved, admissionWaiting              prometheus.Gauge
	// adm is the admission of checkpoints before their pause, overhead
	// what its estimate adds per container (admission.go).
	adm      *admission
	overhead int64

	mu sync.Mutex
	// inUse counts the restores (warm starts, warm restarts) reading each
	// checkpoint directory (Use); retention leaves those alone.
	inUse map[string]int
	// pullReserved is the archive bytes of the pulls in progress, and
	// pinnedPulled the pulled checkpoints a RunPodSandbox is starting a
	// pod from (pulledcap.go).
	pullReserved int64
	pinnedPulled map[string]int
	// removing holds the pulled checkpoints renamed away that this shim
	// is deleting now (pulled.go); the sweep takes any other.
	removing map[string]bool
}

// New builds the store. rt is the runtime's CRI client (containerd): the
// schedule lists containers and the admission reads their stats. The root
// is created.
func New(cfg Config, rt runtimeapi.RuntimeServiceClient, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	s := &Store{cfg: cfg, rt: rt, log: log, now: time.Now, adm: newAdmission(cfg.MaxConcurrentCaptures), overhead: estimateOverhead,
		inUse: map[string]int{}, pinnedPulled: map[string]int{}, removing: map[string]bool{},
		scheduled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_scheduled_checkpoints_total",
			Help: "Checkpoints taken for pods' checkpoint.cri-shim.io/interval schedules, by result.",
		}, []string{"result"}),
		retentionRemove: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pod_checkpoints_removed_total",
			Help: "Managed checkpoints removed by retention (max_per_pod, max_bytes_per_namespace, max_total_bytes, a pod's checkpoint.cri-shim.io/keep).",
		}),
		pulledReserved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cri_shim_pulled_checkpoint_reserved_bytes",
			Help: "Archive bytes reserved by checkpoint pulls in progress under [checkpoint] pull_max_total_bytes.",
		}),
		pulledEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pulled_checkpoints_evicted_total",
			Help: "Pulled checkpoints no pod used, removed to make room for a new pull under [checkpoint] pull_max_total_bytes.",
		}),
		pulledRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pulled_checkpoint_pulls_refused_total",
			Help: "Checkpoint pulls refused (ResourceExhausted) because [checkpoint] pull_max_total_bytes left no room.",
		}),
		admissionRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_checkpoint_admission_refused_total",
			Help: "CheckpointPod calls refused before anything was paused, by reason: pod_min_gap, max_bytes_per_namespace, max_total_bytes (the estimated size would not fit after retention), max_concurrent_captures (no capture slot within the deadline), estimate (the runtime gave no stats).",
		}, []string{"reason"}),
		admissionWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cri_shim_checkpoint_admission_waiting",
			Help: "CheckpointPod calls waiting for one of [checkpoint] max_concurrent_captures capture slots.",
		}),
	}
	s.retireLeftoverPulls()
	return s, nil
}

// Collectors are the store's metrics.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.scheduled, s.retentionRemove, s.pulledReserved, s.pulledEvicted, s.pulledRefused, s.admissionRefused, s.admissionWaiting,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cri_shim_pulled_checkpoint_bytes",
			Help: "Bytes of the checkpoints pulled from registries for restores (oci- directories) on this node.",
		}, func() float64 { return float64(s.PulledBytes()) })}
}

// Use records that a restore reads the checkpoint directory dir, until
// release (which does nothing after its first call): retention, the
// sweep and the pulled-checkpoint cap leave it alone meanwhile.
func (s *Store) Use(dir string) (release func()) {
	s.mu.Lock()
	s.inUse[dir]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.inUse[dir]--; s.inUse[dir] <= 0 {
				delete(s.inUse, dir)
			}
			s.mu.Unlock()
		})
	}
}

// inUseNow are the checkpoint directories restores read, by their readers.
func (s *Store) inUseNow() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.inUse)
}

// short is an ID's first 13 characters, for logs and messages.
func short(id string) string { return id[:min(len(id), 13)] }
