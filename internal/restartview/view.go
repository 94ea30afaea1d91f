// Package restartview is what the kubelet reads of pods that restart in
// place: its container lists, statuses and events pass through here, on
// the encoded messages where it can, and the restart engine
// (internal/podstate) decides, container by container, what the kubelet
// is shown. This package carries the CRI messages (peeks, edits of a list,
// the kept answers for exited instances); it holds no pod state of its own.
package restartview

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// Engine decides what the kubelet is shown of the containers of pods that
// restart in place (podstate.Manager). Its errors are the CRI call's: a
// verdict that could not be recorded is Unavailable, and the kubelet asks
// again.
type Engine interface {
	// Tracked is how many pods the engine governs; with none, every call
	// is forwarded raw.
	Tracked() int
	// Interest is what Verdicts may decide about or record anything of in
	// an unfiltered list: the containers whose ID's head is in heads, but
	// for those in quiet when they are listed running, and every
	// container of the sandboxes it appends to restarting. The others are
	// not handed to Verdicts. The sets do not change once returned: the
	// walk reads them without the engine's lock.
	Interest(restarting []string) (heads, quiet *wire.HeadSet, _ []string)
	// Verdicts classifies the exits in a list no one has seen yet, then
	// says of each container whether it is hidden or shown running; want
	// is the caller's state filter, applied after the view.
	Verdicts(ctx context.Context, cs []wire.Container, want *runtimeapi.ContainerStateValue) ([]wire.Verdict, error)
	// StatusMayChange says whether FixStatus could change c's status.
	StatusMayChange(c wire.Container) bool
	// FixStatus classifies an exit and shows what the view shows of s.
	FixStatus(s *runtimeapi.ContainerStatus) error
	// DropEvent says whether a container event is kept from the kubelet.
	DropEvent(e *runtimeapi.ContainerEventResponse) bool
	// Unchanged says whether c is a governed container whose status the
	// view leaves as the runtime gave it.
	Unchanged(c wire.Container) bool
}

// View takes part in the kubelet's reads (proxy hooks) for an Engine.
type View struct {
	e    Engine
	log  *slog.Logger
	live func() uint64
	// exited holds the runtime's encoded answers for exited instances of
	// governed pods, container ID -> *exitedStatus (exited.go).
	exited sync.Map
	reused prometheus.Counter
}

// The calls a View takes part in. Every status path the kubelet reads goes
// through the same engine, so the kubelet never sees a triggering exit as
// final, whichever call it happens to make first.
var (
	_ proxy.ListContainersFramesHook = (*View)(nil)
	_ proxy.ContainerStatusBytesHook = (*View)(nil)
	_ proxy.GetContainerEventsHook   = (*View)(nil)
	_ proxy.StreamContainersHook     = (*View)(nil)
	_ proxy.RemoveContainerHook      = (*View)(nil)
	_ proxy.Activity                 = (*View)(nil)
)

// New returns the view of e's pods. live reports the subscription of the
// event feed that reports removals to OnEvent (events.Feed.Live): answers
// are kept only while it is subscribed; nil: no feed.
func New(e Engine, live func() uint64, log *slog.Logger) *View {
	if live == nil {
		live = func() uint64 { return 0 }
	}
	return &View{
		e: e, log: log, live: live,
		reused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_exited_status_reused_total", Help: "ContainerStatus calls for exited instances of governed containers answered with the runtime's kept answer, without a round trip.",
		}),
	}
}

// Collectors are the view's metrics.
func (v *View) Collectors() []prometheus.Collector { return []prometheus.Collector{v.reused} }

// HookActive: the calls are seen only while the engine governs a pod.
func (v *View) HookActive(proxy.Method) bool { return v.e.Tracked() > 0 }

// RemoveContainer drops the kept answer of a container the kubelet
// removes: before (no kept answer outlives the container) and after (a
// status asked while the removal ran may have been kept again).
func (v *View) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
	next proxy.UnaryNext[runtimeapi.RemoveContainerRequest, runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	v.exited.Delete(req.ContainerId)
	resp, err := next(ctx, req)
	v.exited.Delete(req.ContainerId)
	return resp, err
}

// OnEvent takes the runtime's container events (the shim's event feed): a
// container removed, maybe behind the shim, has its kept answer dropped.
func (v *View) OnEvent(e *events.Event) {
	if e.Type == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		v.exited.Delete(e.ContainerID)
	}
}

// Run drops, every pruneEvery until ctx ends, the kept answers no call may
// use again: kept under an earlier subscription of the event feed, or of a
// container the engine no longer governs as it was.
func (v *View) Run(ctx context.Context) {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			v.prune()
		}
	}
}

const pruneEvery = 10 * time.Second
