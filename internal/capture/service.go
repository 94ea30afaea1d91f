// Package capture serves CheckpointPod (KEP-5823): one consistent cut of a
// pod's containers, paused together, captured by containerd's runc/CRIU
// and written as a checkpoint directory (internal/layout) of container
// archives (internal/ckptarchive). It owns what a capture leaves behind:
// the frozen records that make a killed shim resume every paused container
// at its next start, and the directories an interrupted capture left
// incomplete. What is done with checkpoints afterwards is internal/ckptstore's
// (retention, schedules), internal/restore's and internal/warm's (restores).
package capture

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// Config is what a capture needs of the shim's configuration.
type Config struct {
	// Root confines every checkpoint path.
	Root string
	// StateDir holds the frozen records (stateDir/checkpoint).
	StateDir string
	// StreamDuringCapture copies the memory pages into each archive while
	// CRIU writes them (internal/ckptarchive): the whole call is shorter,
	// the pod's freeze longer (docs/checkpoint.md). Otherwise they are
	// copied once the pod runs again.
	StreamDuringCapture bool
	// CRIUVersion reports the CRIU version for manifests; nil leaves it "unknown".
	CRIUVersion func() (string, error)
	// Retain is told of each checkpoint written (its directory and its
	// pod's namespace) and applies the node's retention to it; an error
	// removes the new checkpoint and fails the call with the error's
	// class. nil keeps every checkpoint.
	Retain func(dir, namespace string) error
	// Admit, when set, is asked once the call's containers are known and
	// before anything is paused whether the node takes this checkpoint
	// now (internal/ckptstore's admission: the pod's last checkpoint, the
	// checkpoint's estimated size against the retention bounds, the node's
	// concurrent captures). It may wait, within ctx's deadline less
	// Admission.Margin. An error fails the call with its class, nothing
	// paused or written; done is called once the call and any work it left
	// behind have ended (after Retain).
	Admit func(ctx context.Context, a Admission) (done func(), err error)
	// Timing bounds the capture's waits; the zero value is DefaultTiming.
	Timing Timing
	// Captures finds containerd's captures still running (runc checkpoint
	// processes), which a shim killed mid-capture does not wait for, and
	// waits for their end; nil watches this host's processes (capturing.go).
	Captures CaptureWatch
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Admission is what Config.Admit is asked about.
type Admission struct {
	// Namespace, Pod and UID name the pod; SandboxID is its sandbox.
	Namespace, Pod, UID, SandboxID string
	// Managed says it is a managed (scheduled or 'cri-shim checkpoint')
	// checkpoint, which retention may remove later.
	Managed bool
	// Containers are the IDs of the containers to capture.
	Containers []string
	// Margin is the time the capture needs before the call's deadline
	// once admitted: a wait ends that much earlier.
	Margin time.Duration
}

// Timing is how long the service waits for each step of a capture.
type Timing struct {
	// Dump bounds one container's capture, whatever the caller's deadline
	// (the capture goes on in containerd after a caller gives up; the
	// service waits for it so that nothing is left frozen or written).
	Dump time.Duration
	// Resume bounds one resume attempt.
	Resume time.Duration
	// RetryEvery is how often pods whose resume failed are tried again.
	RetryEvery time.Duration
	// MarginBase and MarginPer make the margin kept before the caller's
	// deadline to resume the pod's containers: MarginBase plus MarginPer
	// per container.
	MarginBase, MarginPer time.Duration
}

// DefaultTiming is the production timing.
var DefaultTiming = Timing{Dump: 10 * time.Minute, Resume: 10 * time.Second, RetryEvery: 5 * time.Second,
	MarginBase: 100 * time.Millisecond, MarginPer: 50 * time.Millisecond}

// Service serves CheckpointPod, as a proxy feature.
type Service struct {
	cfg   Config
	rt    runtimeapi.RuntimeServiceClient
	img   runtimeapi.ImageServiceClient
	tasks Tasks
	watch CaptureWatch
	log   *slog.Logger
	now   func() time.Time

	metrics *metrics

	dumpTimeout, resumeTimeout, retryEvery time.Duration
	marginBase, marginPer                  time.Duration

	// inflight tracks captures still running in containerd after their
	// CheckpointPod returned on deadline expiry, and the watchers of
	// frozen records whose capture still runs (Wait).
	inflight sync.WaitGroup

	mu sync.Mutex
	// jobs and jobsByOut hold the sandboxes and output directories of
	// checkpoints in progress or still finishing after their call returned
	// (jobs.go).
	jobs      map[string]*job
	jobsByOut map[string]*job
	// pendingResume is set while a frozen record could not be cleared;
	// resumeGen counts resumeFailed calls, so that a pass of ResumeRecorded
	// that started before one does not clear the flag.
	pendingResume bool
	resumeGen     uint64
}

// New builds the service. rt and img are the runtime's CRI clients
// (containerd), tasks its task service. The state directory is created.
func New(cfg Config, rt runtimeapi.RuntimeServiceClient, img runtimeapi.ImageServiceClient, tasks Tasks, log *slog.Logger) (*Service, error) {
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "checkpoint"), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	t := cfg.Timing
	if t == (Timing{}) {
		t = DefaultTiming
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	if cfg.StreamDuringCapture {
		log.Info("checkpoint: memory pages copied into the archives during the capture (stream_archives)")
	} else {
		log.Info("checkpoint: memory pages copied into the archives after the resume")
	}
	watch := cfg.Captures
	if watch == nil {
		watch = HostCaptures()
	}
	return &Service{cfg: cfg, rt: rt, img: img, tasks: tasks, watch: watch, log: log, now: now, metrics: newMetrics(),
		dumpTimeout: t.Dump, resumeTimeout: t.Resume, retryEvery: t.RetryEvery, marginBase: t.MarginBase, marginPer: t.MarginPer,
		jobs: map[string]*job{}, jobsByOut: map[string]*job{}}, nil
}

var _ proxy.CheckpointPodServer = (*Service)(nil)

// Recover resumes the pods an earlier shim left frozen and empties the
// checkpoints it left incomplete, once at start before any call is served.
// Records first: a directory whose capture containerd still runs is emptied
// by ResumeRecorded once that capture ends, not now.
func (s *Service) Recover(ctx context.Context) {
	s.CleanIncomplete(s.ResumeRecorded(ctx))
}

// RetryResumes tries the resumes that failed again every RetryEvery, until
// ctx ends. A record whose capture containerd still runs is not waiting for
// it: a watcher resumes its pod as soon as that capture ends (resumeOne).
func (s *Service) RetryResumes(ctx context.Context) {
	t := time.NewTicker(s.retryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.ResumePending() {
				s.ResumeRecorded(ctx)
			}
		}
	}
}

// ResumePending reports whether a resume failed and is retried.
func (s *Service) ResumePending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pendingResume
}

// Wait waits for the captures that calls abandoned at their deadline, and
// those of frozen records found at start, to end in containerd and be
// cleaned up after.
func (s *Service) Wait() { s.inflight.Wait() }

// Collectors are the service's metrics.
func (s *Service) Collectors() []prometheus.Collector { return s.metrics.collectors() }

// The helpers of proxy's error classification.
var (
	errorf      = proxy.Errorf
	message     = proxy.Message
	runtimeKind = proxy.RuntimeKind
	code        = proxy.Code
)

// isNotFound reports whether a runtime call's error says the object is gone.
func isNotFound(err error) bool { return proxy.NotFound(err) || os.IsNotExist(err) }

// short is an ID's first 13 characters, for logs and messages.
func short(id string) string { return id[:min(len(id), 13)] }
