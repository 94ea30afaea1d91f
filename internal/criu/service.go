package criu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/statefile"
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
	// MaxPerPod and MaxTotalBytes are the retention of managed checkpoints (0: unbounded).
	MaxPerPod     int
	MaxTotalBytes int64
	// MaxBytesPerNamespace bounds the managed checkpoints of each namespace (0: unbounded).
	MaxBytesPerNamespace int64
	// MinInterval is the shortest schedule a pod's IntervalAnnotation gets (schedule.go).
	MinInterval time.Duration
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
	// the directory under Root it pulled it into (PulledDirPrefix), or an
	// error of an errdefs class (ErrForeignCheckpoint: refused by the
	// namespace binding). It waits for a pull only a bounded time. nil
	// refuses image references.
	PullRestore func(ctx context.Context, namespace, pod, uid, ref string) (string, error)
	// PreCopy configures memory pre-copy (precopy.go); the zero value is off.
	PreCopy PreCopyConfig
	// PullMaxTotalBytes bounds the pulled checkpoints on the node together,
	// those being pulled included (ReservePulled); 0: unbounded.
	PullMaxTotalBytes int64
}

// Service serves CheckpointPod and RestorePod and the warm-start routes.
type Service struct {
	cfg   Config
	rt    runtimeapi.RuntimeServiceClient
	img   runtimeapi.ImageServiceClient
	tasks Tasks
	log   *slog.Logger
	now   func() time.Time

	metrics *metrics

	// dumpTimeout bounds one container's capture, whatever the caller's
	// deadline (the capture goes on in containerd after a caller gives up;
	// the service waits for it so that nothing is left frozen or written).
	dumpTimeout time.Duration
	// resumeTimeout bounds one resume attempt.
	resumeTimeout time.Duration
	// retryEvery is how often pods whose resume failed are tried again.
	retryEvery time.Duration
	// marginBase and marginPer make the margin kept before the caller's
	// deadline to resume the pod's containers (see resumeMargin).
	marginBase, marginPer time.Duration

	// inflight tracks captures still running in containerd after their
	// CheckpointPod returned on deadline expiry (tests wait on it).
	inflight sync.WaitGroup

	// preCopy is the start-up decision on memory pre-copy (precopy.go).
	preCopy preCopyPlan

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
	// jobs and jobsByOut hold the sandboxes and output directories of
	// checkpoints in progress or still finishing after their call returned
	// (jobs.go).
	jobs      map[string]*job
	jobsByOut map[string]*job
	// captureRunning reports whether containerd still runs a capture of the
	// container (a runc checkpoint process), which a shim killed mid-capture
	// does not wait for; nil is procCaptureRunning.
	captureRunning func(id string) bool
	// pendingResume is set while a frozen record could not be cleared;
	// resumeGen counts resumeFailed calls, so that a pass of resumeRecorded
	// that started before one does not clear the flag.
	pendingResume bool
	resumeGen     uint64
}

// New builds the service. rt and img are the runtime's CRI clients
// (containerd), tasks its task service. The checkpoint root and state
// directory are created.
func New(cfg Config, rt runtimeapi.RuntimeServiceClient, img runtimeapi.ImageServiceClient, tasks Tasks, log *slog.Logger) (*Service, error) {
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "checkpoint"), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	s := &Service{
		cfg: cfg, rt: rt, img: img, tasks: tasks, log: log, now: time.Now,
		metrics:       newMetrics(),
		dumpTimeout:   10 * time.Minute,
		resumeTimeout: 10 * time.Second,
		retryEvery:    5 * time.Second,
		marginBase:    100 * time.Millisecond,
		marginPer:     50 * time.Millisecond,
		warm:          make(map[string]*warmPod),
		jobs:          make(map[string]*job),
		jobsByOut:     make(map[string]*job),
	}
	s.retireLeftoverPulls()
	s.preCopy = planPreCopy(cfg.PreCopy, tasks)
	if s.preCopy.use {
		s.metrics.preCopy.Set(1)
		log.Info("checkpoint: memory pre-copy on: each container is pre-dumped while the pod runs, the frozen dump writes only pages dirtied since")
	} else {
		log.Info("checkpoint: memory pre-copy off", "reason", s.preCopy.reason, "dirtyPageTracking", s.preCopy.tracking)
	}
	if err := s.loadWarm(); err != nil {
		return nil, err
	}
	cfg.Store.Subscribe(s.forgetWarm)
	return s, nil
}

// Collectors are the service's metrics.
func (s *Service) Collectors() []prometheus.Collector {
	return append(s.metrics.collectors(), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cri_shim_pulled_checkpoint_bytes",
		Help: "Bytes of the checkpoints pulled from registries for restores (oci- directories) on this node.",
	}, func() float64 { return float64(s.PulledBytes()) }))
}

// Run recovers from a crash of an earlier shim (pods it had frozen are resumed,
// its unfinished checkpoints removed) and keeps retrying resumes that failed,
// until ctx ends.
func (s *Service) Run(ctx context.Context) {
	s.adoptWarmRestartPods(ctx)
	// Records first: a directory whose capture containerd still runs is
	// emptied by resumeRecorded once that capture ends, not now.
	s.cleanIncomplete(s.resumeRecorded(ctx))
	t := time.NewTicker(s.retryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.mu.Lock()
			pending := s.pendingResume
			s.mu.Unlock()
			if pending {
				s.resumeRecorded(ctx)
			}
		}
	}
}

// frozenRecord is written before the first pause of a checkpoint and removed
// once every container is resumed: a shim killed in between finds it at start
// and resumes them, so no crash leaves a pod frozen.
//
// Frozen records are not per-sandbox records of the state store: there is one
// per call (a later call of a sandbox must not replace the record of an
// earlier one whose resume is pending), and a record must outlive its
// sandbox's removal until its containers are resumed or known gone (the
// resume of a removed container answers NotFound and clears it), so the
// store's Gone must not remove it. They keep statefile's rule in
// stateDir/checkpoint.
type frozenRecord struct {
	SandboxID  string   `json:"sandboxId"`
	Containers []string `json:"containers"`
	OutputPath string   `json:"outputPath"`
	Started    int64    `json:"started"`
}

// frozenPath is the record of one call (sandbox ID and the call's start in
// nanoseconds): a later call of the same sandbox never replaces or removes
// the record of an earlier one whose resume is still pending.
func (s *Service) frozenPath(r frozenRecord) string {
	return filepath.Join(s.cfg.StateDir, "checkpoint", r.SandboxID+"."+strconv.FormatInt(r.Started, 10)+".frozen.json")
}

func (s *Service) writeFrozen(r frozenRecord) error {
	return statefile.WriteJSON(s.frozenPath(r), r, 0o600)
}

// removeRecord deletes a record durably; a failure is logged and counted by
// statefile (the record is then acted on again at the next start, which is
// harmless: resuming a running container is a no-op).
func (s *Service) removeRecord(path string) {
	if err := statefile.Remove(path); err != nil {
		s.log.Error("checkpoint: removing a record", "err", err)
	}
}

// resumeRecorded resumes every container named by a frozen record left behind
// (by a crash, or by a resume that failed) and removes the records it clears.
// It returns the output directories of the records it could not clear yet.
func (s *Service) resumeRecorded(ctx context.Context) (pendingOut map[string]bool) {
	pendingOut = map[string]bool{}
	s.mu.Lock()
	gen := s.resumeGen
	s.mu.Unlock()
	dir := filepath.Join(s.cfg.StateDir, "checkpoint")
	ents, err := os.ReadDir(dir)
	if err != nil {
		s.log.Error("checkpoint: reading frozen records", "err", err)
		return pendingOut
	}
	pending := false
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, statefile.TempSuffix) {
			os.Remove(filepath.Join(dir, name))
			continue
		}
		if !strings.HasSuffix(name, ".frozen.json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		var r frozenRecord
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			s.log.Error("checkpoint: unreadable frozen record removed", "file", name, "err", err)
			s.removeRecord(filepath.Join(dir, name))
			continue
		}
		if !s.resumeOne(ctx, filepath.Join(dir, name), r) {
			pending, pendingOut[r.OutputPath] = true, true
		}
	}
	s.mu.Lock()
	// A resume that failed while this pass ran (a record it may not have
	// read) keeps the retry going.
	s.pendingResume = pending || s.resumeGen != gen
	s.mu.Unlock()
	return pendingOut
}

// resumeOne clears one frozen record: it resumes the record's containers and
// empties the record's output if it is still marked incomplete. It holds the
// record's sandbox and output directory meanwhile, so it never acts on what a
// call running now owns (a record whose sandbox or directory is held waits for
// the next pass), and a directory that a later call has since filled with a
// complete checkpoint is left alone. It reports whether the record is cleared.
func (s *Service) resumeOne(ctx context.Context, path string, r frozenRecord) bool {
	j := s.tryHold(r.SandboxID, r.OutputPath)
	if j == nil {
		return false
	}
	defer s.release(j)
	// A shim killed mid-capture does not stop containerd's capture: CRIU
	// goes on with the paused container and, when it ends, puts the
	// freezer back as it found it (frozen). Resuming before then would be
	// undone, so wait for the capture to end first.
	if id, ok := s.anyCaptureRunning(r.Containers); ok {
		s.log.Info("checkpoint: an interrupted checkpoint's capture is still running in containerd; resuming once it ends", "sandbox", short(r.SandboxID), "container", short(id))
		return false
	}
	if err := s.thawAll(ctx, r.Containers, true); err != nil {
		s.log.Error("checkpoint: resuming containers of an interrupted checkpoint; will retry", "sandbox", r.SandboxID, "err", err)
		return false
	}
	if r.OutputPath != "" && marked(r.OutputPath) {
		if err := s.removeOutput(r.OutputPath); err != nil {
			s.log.Warn("checkpoint: removing an interrupted checkpoint's files", "path", r.OutputPath, "err", err)
		}
	}
	s.removeRecord(path)
	s.log.Info("checkpoint: resumed the containers of an interrupted checkpoint", "sandbox", r.SandboxID, "containers", len(r.Containers))
	return true
}

// marked reports whether dir still carries the incomplete mark: only then is
// what it holds the unfinished checkpoint of the call that marked it.
func marked(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, incompleteFile))
	return err == nil
}

// thawAll resumes every listed container that is paused. With check, each is
// asked first (a record may outlive the pause); a container that no longer
// exists needs nothing.
func (s *Service) thawAll(ctx context.Context, ids []string, check bool) error {
	var errs []error
	for _, id := range ids {
		if err := s.thaw(ctx, id, check); err != nil {
			errs = append(errs, fmt.Errorf("resume %s: %w", short(id), err))
		}
	}
	return errors.Join(errs...)
}

func (s *Service) thaw(ctx context.Context, id string, check bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.resumeTimeout)
	defer cancel()
	if check {
		paused, err := s.tasks.Paused(ctx, id)
		if err != nil {
			if isNotFound(err) {
				return nil
			}
			return err
		}
		if !paused {
			return nil
		}
	}
	err := s.tasks.Resume(ctx, id)
	if err != nil && isNotFound(err) {
		return nil
	}
	return err
}

// cleanIncomplete removes what an interrupted checkpoint wrote under the root:
// any directory still marked incomplete is emptied (the directory itself
// belongs to its caller and stays), but for those in skip, which a record
// still pending owns.
func (s *Service) cleanIncomplete(skip map[string]bool) {
	ents, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		s.log.Error("checkpoint: reading the checkpoint root", "root", s.cfg.Root, "err", err)
		return
	}
	for _, e := range ents {
		// Pulls' temporary directories and pulled checkpoints being
		// deleted are the sweep's (pulled.go); a pull of this shim may
		// already be writing one.
		if !e.IsDir() || strings.HasPrefix(e.Name(), pulledTempPrefix) || strings.HasPrefix(e.Name(), pulledRemovingPrefix) {
			continue
		}
		dir := filepath.Join(s.cfg.Root, e.Name())
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue
		}
		if skip[real] || skip[dir] || !marked(real) {
			continue
		}
		// A call that started meanwhile (the socket serves while this runs)
		// owns its directory: leave it.
		j := s.tryHold("", real)
		if j == nil {
			continue
		}
		err = s.removeOutput(real)
		s.release(j)
		if err != nil {
			s.log.Warn("checkpoint: removing an interrupted checkpoint's files", "path", dir, "err", err)
			continue
		}
		s.log.Info("checkpoint: removed the files of an interrupted checkpoint", "path", dir)
	}
}

// removeOutput empties a checkpoint directory, keeping the directory.
func (s *Service) removeOutput(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}
