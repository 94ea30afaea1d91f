// Package podstate is cri-shim's in-place pod restart (KEP-5532's
// RestartAllContainers) for an unmodified kubelet: when a container of a pod
// with a matching restart rule exits, the pod's containers are stopped
// gracefully and started again in the same sandbox, init containers first,
// with the kubelet doing the starting. docs/in-place-restart.md explains the
// mechanism and the kubelet code it relies on. This package decides and
// acts; what it knows of each pod is its record (internal/restartrecord),
// changed only inside a restartrecord.Change.
package podstate

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/util/workqueue"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// runtimeService is the part of the CRI the manager calls on the runtime itself.
type runtimeService interface {
	ListContainers(ctx context.Context, in *runtimeapi.ListContainersRequest, opts ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error)
	ContainerStatus(ctx context.Context, in *runtimeapi.ContainerStatusRequest, opts ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error)
	StopContainer(ctx context.Context, in *runtimeapi.StopContainerRequest, opts ...grpc.CallOption) (*runtimeapi.StopContainerResponse, error)
	CreateContainer(ctx context.Context, in *runtimeapi.CreateContainerRequest, opts ...grpc.CallOption) (*runtimeapi.CreateContainerResponse, error)
	StartContainer(ctx context.Context, in *runtimeapi.StartContainerRequest, opts ...grpc.CallOption) (*runtimeapi.StartContainerResponse, error)
	ExecSync(ctx context.Context, in *runtimeapi.ExecSyncRequest, opts ...grpc.CallOption) (*runtimeapi.ExecSyncResponse, error)
	PodSandboxStatus(ctx context.Context, in *runtimeapi.PodSandboxStatusRequest, opts ...grpc.CallOption) (*runtimeapi.PodSandboxStatusResponse, error)
	RemoveContainer(ctx context.Context, in *runtimeapi.RemoveContainerRequest, opts ...grpc.CallOption) (*runtimeapi.RemoveContainerResponse, error)
	StopPodSandbox(ctx context.Context, in *runtimeapi.StopPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.StopPodSandboxResponse, error)
	RemovePodSandbox(ctx context.Context, in *runtimeapi.RemovePodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error)
}

// Manager tracks the pods that carry restart rules and drives their restarts.
// Pods without rules cost nothing: the proxy's routes check Tracked() and
// forward raw when it is zero.
type Manager struct {
	rt    runtimeService
	st    *restartrecord.Store
	bo    *backoff.Tracker
	log   *slog.Logger
	clock backoff.Clock

	tracked atomic.Int32
	// reads are the tracked pods' read counters by sandbox ID (Pod.Reads),
	// for ObservePodSandboxStatus, which takes no lock.
	reads sync.Map

	mu   sync.Mutex
	pods *restartrecord.Records // the tracked pods' records (under mu)

	// queue holds the sandboxes with a restart step to run (engine.go);
	// running has the cancel of each step in progress, by sandbox ID.
	queue   workqueue.TypedRateLimitingInterface[string]
	running sync.Map
	// quit is closed when Run ends: steps stop at their next wait, after
	// the runtime call they are in (engine.go).
	quit     chan struct{}
	quitOnce sync.Once
	metrics  *metrics

	// opts are New's, with EventsLive and Observer never nil and KeepDead
	// at least 1.
	opts Options

	// phaseChanged is closed and replaced at every phase change and every
	// instance forgotten (under mu; update.go), so a wait for a restart to
	// end, or for the kubelet to remove instances, needs no polling.
	phaseChanged chan struct{}
	backlogWait  time.Duration
	// stateWaits are the replay's waits for a container's state to change,
	// by container ID (chan struct{}), closed by the event feed's start and
	// stop events (waitFor).
	stateWaits sync.Map

	// debug: the log is at debug level, so restarts are traced (trace.go);
	// traces holds each sandbox's restart trace (*restartTrace).
	debug  bool
	traces sync.Map
}

// Options are what a Manager takes beside the runtime, the state directory
// and the backoff curves; each one's zero value is the default.
type Options struct {
	// KeepDead is how many exited instances of each container the kubelet
	// keeps (its --maximum-dead-containers-per-container; below 1: 1).
	KeepDead int
	// TrackAlso makes pods without restart rules tracked too when it
	// reports true for their spec (pods that declare an orchestrator may
	// be restarted on its command); nil: none.
	TrackAlso func(podspec.Spec) bool
	// EventsLive reports the subscription of the event feed that delivers
	// exits to OnEvent (events.Feed.Live), so rescans can be rarer while
	// it is subscribed; nil: no feed, Run rescans every second.
	EventsLive func() uint64
	// Observer hears of restarts (observer.go); nil: none.
	Observer restartapi.Observer
	// Warm restores replayed containers of pods that ask for it (warm.go);
	// nil: none.
	Warm restartapi.WarmSource
}

// New loads the persisted pods from stateDir and returns a manager. Restarts
// that were in progress when the shim stopped resume when Run starts.
func New(rt runtimeService, stateDir string, bo *backoff.Tracker, log *slog.Logger, o Options) (*Manager, error) {
	st, err := restartrecord.Open(stateDir)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		rt: rt, st: st, bo: bo, log: log, clock: backoff.RealClock, pods: restartrecord.NewRecords(st, log),
		queue: newQueue(), quit: make(chan struct{}), metrics: newMetrics(),
		opts: o, backlogWait: maxBacklogWait, debug: debugEnabled(log),
	}
	m.opts.KeepDead = max(o.KeepDead, 1)
	if m.opts.EventsLive == nil {
		m.opts.EventsLive = func() uint64 { return 0 }
	}
	if m.opts.Observer == nil {
		m.opts.Observer = noObserver{}
	}
	pods, errs := st.Load()
	for _, err := range errs {
		log.Error("podstate: unreadable state file skipped", "err", err)
	}
	// Stopped sandboxes first: where a pod has an old sandbox and a live
	// one, the live one's curve position is the one that stays.
	slices.SortStableFunc(pods, func(a, b *restartrecord.Pod) int {
		if a.Stopped == b.Stopped {
			return 0
		}
		if a.Stopped {
			return -1
		}
		return 1
	})
	for _, p := range pods {
		m.adopt(p)
		p.ResumeShown()
		if p.Trigger != nil && p.Scope == "" {
			bo.Restore(backoff.Key{PodUID: p.UID}, p.SandboxID, backoff.State{Restarts: p.Restarts, NotBefore: p.NotBefore})
		}
		for c, n := range p.ContainerRestarts {
			bo.Restore(backoff.Key{PodUID: p.UID, Container: c}, p.SandboxID, backoff.State{Restarts: n})
		}
	}
	return m, nil
}

// adopt tracks p (new, or loaded from disk). m.mu held, or not yet shared.
func (m *Manager) adopt(p *restartrecord.Pod) {
	m.pods.Add(p)
	m.reads.Store(p.SandboxID, p.Reads)
	m.tracked.Store(int32(m.pods.Len()))
}

// Tracked is the number of pods with rules; zero means every call may be forwarded raw.
func (m *Manager) Tracked() int { return int(m.tracked.Load()) }
