package podmgmt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"github.com/cri-shim/cri-shim/internal/events"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/store"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// Restarter restarts containers through the shim's governed restart machinery
// (the restart-rules feature, with its backoff).
type Restarter interface {
	RestartContainer(ctx context.Context, sandboxID, container, reason string) error
	RestartPod(ctx context.Context, sandboxID, reason string) error
	// HoldContainer marks (hold true) a container the orchestrator
	// terminates, so that the pod's restart rules leave its exits alone
	// until the orchestrator restarts it, or clears the mark. The mark is
	// durable when it returns nil.
	HoldContainer(ctx context.Context, sandboxID, container string, hold bool) error
}

// QueueSize bounds a pod's undelivered notifications.
const QueueSize = 256

// Manager runs the channels of every pod that declares one.
type Manager struct {
	rt runtimeapi.RuntimeServiceClient
	// dir holds the tokens (record.go); store, records and states the
	// records.
	dir             string
	store           *store.Store
	records, states *store.Bucket
	log             *slog.Logger
	restarter       Restarter
	metrics         *metrics
	// dial connects to a sidecar (tests replace it).
	dial func(addr string) (*grpc.ClientConn, error)
	// checkAddr refuses pod IPs that are not a pod's (podAddressOK; tests
	// whose fake pods live on 127.0.0.1 replace it).
	checkAddr func(netip.Addr) error
	// backoff bounds between connection attempts.
	minBackoff, maxBackoff time.Duration
	// sweepEvery is how often Run drops the records of sandboxes the runtime
	// no longer has (removed behind the shim's back).
	sweepEvery time.Duration

	ctx context.Context // Run's, for connectors started by routes

	mu   sync.Mutex
	pods map[string]*pod // sandbox ID
	// exitCodes indexes every pod's Overrides by container ID, for the
	// ContainerStatus route; overridden counts them, so that the route stays
	// on the raw path while no container has one.
	exitCodes map[string]int32
	// orch maps the instances of declared orchestrator containers to their
	// sandbox, so StartContainer finds whose channel to start.
	orch       map[string]string
	active     atomic.Int32
	overridden atomic.Int32
}

type pod struct {
	SandboxID string           `json:"sandboxId"`
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	UID       string           `json:"uid"`
	Decl      Declaration      `json:"declaration"`
	Overrides map[string]int32 `json:"overrides,omitempty"` // container ID -> exit code asked by TerminateContainer
	// Terminating: StopPodSandbox started; the channel stays closed and no
	// command is carried out, across shim restarts too.
	Terminating bool `json:"terminating,omitempty"`

	token       string
	queue       chan *pb.ContainerEvent
	dropped     atomic.Int64
	state       atomic.Value // string: waiting, connecting, connected, backoff, refused
	terminating atomic.Bool
	cancel      context.CancelFunc
	orchIDs     map[string]bool // keys of Manager.orch that are this pod's; m.mu

	saveMu  sync.Mutex // orders the pod's file writes
	gone    bool       // the record was removed; saveMu
	written string     // the state last written to the state file; saveMu
}

// New builds the manager. Its records are kept in st; the tokens under
// stateDir/podmgmt. It subscribes to st's sandbox lifecycle: a sandbox
// announced gone is dropped.
func New(rt runtimeapi.RuntimeServiceClient, stateDir string, st *store.Store, restarter Restarter, log *slog.Logger) (*Manager, error) {
	dir := filepath.Join(stateDir, "podmgmt")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m := &Manager{rt: rt, dir: dir, store: st, log: log, restarter: restarter, metrics: newMetrics(), checkAddr: podAddressOK,
		pods: map[string]*pod{}, exitCodes: map[string]int32{}, orch: map[string]string{},
		minBackoff: 200 * time.Millisecond, maxBackoff: 30 * time.Second, sweepEvery: time.Minute,
		dial: func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}}
	if err := m.openRecords(st); err != nil {
		return nil, err
	}
	if err := m.loadAll(); err != nil {
		return nil, err
	}
	m.active.Store(int32(len(m.pods)))
	m.overridden.Store(int32(len(m.exitCodes)))
	st.Subscribe(func(id string) {
		if err := m.drop(id); err != nil {
			m.log.Warn("podmgmt: removing the record of a sandbox that is gone", "sandbox", id, "err", err)
		}
	})
	return m, nil
}

func (p *pod) init() {
	p.queue = make(chan *pb.ContainerEvent, QueueSize)
	p.state.Store("waiting")
	if p.Overrides == nil {
		p.Overrides = map[string]int32{}
	}
	p.orchIDs = map[string]bool{}
}

// Collectors are the channel metrics.
func (m *Manager) Collectors() []prometheus.Collector { return m.metrics.collectors() }

// Run keeps the channels of known pods until ctx ends, and drops the
// records of sandboxes the runtime no longer has: at start (removed while
// the shim was down) and every sweepEvery (removed without the shim seeing
// RemovePodSandbox).
func (m *Manager) Run(ctx context.Context) {
	m.sweep(ctx)
	m.mu.Lock()
	m.ctx = ctx
	for _, p := range m.pods {
		m.connectLocked(p)
	}
	m.mu.Unlock()
	t := time.NewTicker(m.sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.sweep(ctx)
		}
	}
}

// sweep drops every pod whose sandbox the runtime reports NotFound.
func (m *Manager) sweep(ctx context.Context) {
	m.mu.Lock()
	known := make([]*pod, 0, len(m.pods))
	for _, p := range m.pods {
		known = append(known, p)
	}
	m.mu.Unlock()
	for _, p := range known {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := m.rt.PodSandboxStatus(sctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.SandboxID})
		cancel()
		if status.Code(err) == codes.NotFound {
			// Announced to every feature: none keeps records of it.
			if err := m.store.Gone(p.SandboxID); err != nil {
				m.log.Warn("podmgmt: removing the record of a sandbox that no longer exists", "sandbox", p.SandboxID, "err", err)
			}
			m.log.Info("podmgmt: dropped the channel of a sandbox that no longer exists", "sandbox", p.SandboxID)
		}
	}
}

// drop forgets a removed sandbox: its connector, every map entry it owns,
// its metric series and its record.
func (m *Manager) drop(sandbox string) error {
	m.mu.Lock()
	p := m.pods[sandbox]
	if p == nil {
		m.mu.Unlock()
		// A record whose removal failed before (the kubelet retries).
		return m.removeRecord(sandbox)
	}
	if p.cancel != nil {
		p.cancel()
		p.cancel = nil
	}
	delete(m.pods, sandbox)
	for id := range p.Overrides {
		delete(m.exitCodes, id)
	}
	for id := range p.orchIDs {
		delete(m.orch, id)
	}
	m.active.Store(int32(len(m.pods)))
	m.overridden.Store(int32(len(m.exitCodes)))
	m.metrics.connected.DeleteLabelValues(p.Namespace, p.Name)
	m.mu.Unlock()
	return m.forgetRecord(p)
}

// newPod registers a sandbox that declares a channel and writes its token
// and record durably; on an error nothing of it is kept.
func (m *Manager) newPod(sandbox string, md *runtimeapi.PodSandboxMetadata, d *Declaration) error {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return err
	}
	p := &pod{SandboxID: sandbox, Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid(), Decl: *d,
		token: hex.EncodeToString(buf)}
	p.init()
	if err := m.create(p); err != nil {
		return err
	}
	m.mu.Lock()
	m.pods[sandbox] = p
	m.active.Store(int32(len(m.pods)))
	m.mu.Unlock()
	return nil
}

func (m *Manager) get(sandbox string) *pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods[sandbox]
}

// notify queues an event for the pod's sidecar; a full queue drops it (counted
// and logged) rather than ever holding up a CRI call.
func (m *Manager) notify(p *pod, ev *pb.ContainerEvent) {
	if p.terminating.Load() {
		return // the channel is closed with the sandbox
	}
	select {
	case p.queue <- ev:
	default:
		p.dropped.Add(1)
		m.metrics.dropped.Inc()
		m.log.Warn("podmgmt: notification queue full; event dropped (the sidecar gets the current state on its next reconnect)",
			"pod", p.Namespace+"/"+p.Name, "container", ev.ContainerName, "event", ev.Type.String())
	}
}

// connectLocked starts the pod's connector if it is not running; m.mu held.
func (m *Manager) connectLocked(p *pod) {
	if p.cancel != nil || m.ctx == nil || p.terminating.Load() {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	p.cancel = cancel
	go m.connector(ctx, p)
}

// terminate marks the pod terminating (no command carried out, no
// notification sent, no reconnect) and stops its connector, at once and in
// memory first; then records the mark. An error means the mark is not
// durable yet.
func (m *Manager) markTerminating(p *pod) error {
	p.terminating.Store(true)
	m.mu.Lock()
	if p.cancel != nil {
		p.cancel()
		p.cancel = nil
	}
	was := p.Terminating
	p.Terminating = true
	m.metrics.connected.DeleteLabelValues(p.Namespace, p.Name)
	m.mu.Unlock()
	if was {
		return nil
	}
	if err := m.save(p); err != nil {
		m.mu.Lock()
		p.Terminating = false // written on the kubelet's retry
		m.mu.Unlock()
		return err
	}
	return nil
}

// connector keeps the pod's channel up: connect with exponential backoff
// until the sidecar answers, resend the current state, then deliver queued
// events and serve commands until the connection fails; then again.
func (m *Manager) connector(ctx context.Context, p *pod) {
	delay := m.minBackoff
	for ctx.Err() == nil {
		err := m.session(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if r := (*refusal)(nil); errors.As(err, &r) {
			m.refuse(p, r)
			return
		}
		m.setState(p, "backoff")
		m.setConnected(p, 0)
		m.log.Debug("podmgmt: channel down; retrying", "pod", p.Namespace+"/"+p.Name, "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		if delay *= 2; delay > m.maxBackoff {
			delay = m.maxBackoff
		}
		if err == nil { // it was connected: start over fast
			delay = m.minBackoff
		}
	}
}

func (m *Manager) session(ctx context.Context, p *pod) error {
	m.setState(p, "connecting")
	sb, err := m.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.SandboxID})
	if err != nil {
		return err
	}
	addr, err := m.podAddr(sb.GetStatus(), p.Decl.Port)
	if err != nil {
		return err
	}
	conn, err := m.dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := pb.NewPodManagementClient(conn)
	cctx := metadata.AppendToOutgoingContext(ctx, podmanagement.TokenMetadata, p.token)
	hctx, cancel := context.WithTimeout(cctx, 2*time.Second)
	_, err = c.Hello(hctx, &pb.HelloRequest{Versions: SupportedVersions, Agent: "cri-shim", PodNamespace: p.Namespace, PodName: p.Name, PodUid: p.UID})
	cancel()
	if err != nil {
		return err
	}
	m.setState(p, "connected")
	m.setConnected(p, 1)
	m.log.Info("podmgmt: channel connected", "pod", p.Namespace+"/"+p.Name, "sidecar", p.Decl.Container)
	sctx, scancel := context.WithCancel(cctx)
	defer scancel()
	errc := make(chan error, 2)
	go func() { errc <- m.commands(sctx, p, c) }()
	go func() { errc <- m.deliver(sctx, p, c) }()
	err = <-errc
	scancel()
	<-errc
	return err
}

// deliver resends the current state of every container, then the queued events.
func (m *Manager) deliver(ctx context.Context, p *pod, c pb.PodManagementClient) error {
	for len(p.queue) > 0 { // superseded by the state sent next
		<-p.queue
	}
	var seq uint64
	send := func(ev *pb.ContainerEvent) error {
		seq++
		ev.Sequence = seq
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.NotifyContainerEvent(nctx, &pb.NotifyContainerEventRequest{Event: ev})
		if err == nil {
			m.metrics.sent.Inc()
		}
		return err
	}
	state, err := m.current(ctx, p)
	if err != nil {
		return err
	}
	for _, ev := range state {
		if err := send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-p.queue:
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

// current is the latest instance of every container of the pod, as events.
func (m *Manager) current(ctx context.Context, p *pod) ([]*pb.ContainerEvent, error) {
	r, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.SandboxID}})
	if err != nil {
		return nil, err
	}
	latest := map[string]*runtimeapi.Container{}
	for _, c := range r.GetContainers() {
		n := c.GetMetadata().GetName()
		if l := latest[n]; l == nil || c.GetCreatedAt() > l.GetCreatedAt() {
			latest[n] = c
		}
	}
	var out []*pb.ContainerEvent
	for _, c := range latest {
		switch c.GetState() {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
			if err != nil {
				continue
			}
			out = append(out, m.event(p, st.GetStatus(), pb.EventType_STARTED, "resync"))
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
			if err != nil {
				continue
			}
			out = append(out, m.event(p, st.GetStatus(), pb.EventType_EXITED, "resync"))
		}
	}
	sortEvents(out)
	return out, nil
}

// event builds a notification from a container status.
func (m *Manager) event(p *pod, st *runtimeapi.ContainerStatus, t pb.EventType, msg string) *pb.ContainerEvent {
	ev := &pb.ContainerEvent{ContainerName: st.GetMetadata().GetName(), Type: t, Message: msg}
	if n, err := strconv.Atoi(st.GetAnnotations()["io.kubernetes.container.restartCount"]); err == nil {
		ev.RestartCount = int32(n)
	}
	switch t {
	case pb.EventType_STARTED:
		ev.Time = timestamppb.New(time.Unix(0, st.GetStartedAt()))
	case pb.EventType_EXITED:
		ev.Time = timestamppb.New(time.Unix(0, st.GetFinishedAt()))
		ev.ExitCode = st.GetExitCode()
		if code, ok := m.exitCode(st.GetId()); ok {
			ev.ExitCode = code
			ev.Message = "terminated by the orchestrator"
		}
		if ev.Message == "" {
			ev.Message = st.GetReason()
		}
	}
	return ev
}

// OnEvent takes the runtime's container events (the shim's event feed):
// every start and exit of a tracked pod's containers, including those the
// restart machinery makes itself, becomes a notification. It never blocks: the
// pod's queue is bounded and drops on overflow.
func (m *Manager) OnEvent(e *events.Event) {
	var t pb.EventType
	switch e.Type {
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		t = pb.EventType_STARTED
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		t = pb.EventType_EXITED
	default:
		return
	}
	if m.active.Load() == 0 {
		return
	}
	p := m.get(e.SandboxID)
	if p == nil {
		return
	}
	cs, err := e.Status()
	if err != nil {
		m.log.Warn("podmgmt: container event without a readable status", "container", e.ContainerID, "err", err)
		return
	}
	if cs != nil {
		m.notify(p, m.event(p, cs, t, ""))
	}
}

// setConnected sets the pod's connected gauge, unless the pod is closed or
// gone (their series are deleted under m.mu, so none comes back).
func (m *Manager) setConnected(p *pod, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pods[p.SandboxID] == p && !p.terminating.Load() && p.cancel != nil {
		m.metrics.connected.WithLabelValues(p.Namespace, p.Name).Set(v)
	}
}

// refuse ends a pod's channel for good: logged, counted, shown.
func (m *Manager) refuse(p *pod, r *refusal) {
	m.metrics.refused.WithLabelValues(r.reason).Inc()
	m.mu.Lock()
	m.metrics.connected.DeleteLabelValues(p.Namespace, p.Name)
	m.mu.Unlock()
	m.log.Warn("podmgmt: refusing the pod's orchestrator channel; the shim will not connect",
		"pod", p.Namespace+"/"+p.Name, "reason", r.reason, "err", r.err)
	m.setState(p, "refused("+r.reason+")")
}

// setState records the channel's state, in memory and, on a change, in the
// pod's directory for `cri-shim pods` ("connecting", which alternates with
// "backoff" while a sidecar does not answer, only in memory).
func (m *Manager) setState(p *pod, st string) {
	if old, _ := p.state.Swap(st).(string); old == st || st == "connecting" {
		return
	}
	m.writeState(p, st)
}

// Channel is what `cri-shim pods` shows of a pod's channel.
type Channel struct {
	Namespace, Name, Container string
	Port                       int
	State                      string // state, since, drops, as last recorded
}

// ReadChannels reads the channel records of the shim whose state directory
// is stateDir.
func ReadChannels(stateDir string) []Channel {
	root := store.RootIn(stateDir)
	records, states := store.ReadBucket(root, recordBucket), store.ReadBucket(root, stateBucket)
	keys, _ := records.List()
	var out []Channel
	for _, sb := range keys {
		var p pod
		if records.GetJSON(sb, &p) != nil {
			continue
		}
		st, err := states.Get(sb)
		state := "waiting for the orchestrator to start"
		if err == nil {
			state = strings.TrimSpace(string(st))
		}
		out = append(out, Channel{p.Namespace, p.Name, p.Decl.Container, p.Decl.Port, state})
	}
	return out
}

// exitCode is the exit code a TerminateContainer command asked for, if any.
func (m *Manager) exitCode(id string) (int32, bool) {
	if m.overridden.Load() == 0 {
		return 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	code, ok := m.exitCodes[id]
	return code, ok
}

// setExitCode records (or, with ok false, forgets) a requested exit code; an
// error means the record could not be written (and the change is undone).
func (m *Manager) setExitCode(p *pod, id string, code int32, ok bool) error {
	m.mu.Lock()
	old, had := p.Overrides[id]
	m.setExitCodeLocked(p, id, code, ok)
	m.mu.Unlock()
	if err := m.save(p); err != nil {
		m.mu.Lock()
		m.setExitCodeLocked(p, id, old, had)
		m.mu.Unlock()
		return err
	}
	return nil
}

// setExitCodeLocked changes the pod's override and the index; m.mu held.
func (m *Manager) setExitCodeLocked(p *pod, id string, code int32, ok bool) {
	if ok {
		p.Overrides[id], m.exitCodes[id] = code, code
	} else {
		delete(p.Overrides, id)
		delete(m.exitCodes, id)
	}
	m.overridden.Store(int32(len(m.exitCodes)))
}

// sortEvents orders a state snapshot by time, so that a sidecar replaying it
// ends with the current picture.
func sortEvents(evs []*pb.ContainerEvent) {
	slices.SortStableFunc(evs, func(a, b *pb.ContainerEvent) int {
		return a.GetTime().AsTime().Compare(b.GetTime().AsTime())
	})
}
