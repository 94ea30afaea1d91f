package podmgmt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/cri-shim/cri-shim/internal/events"
	"log/slog"
	"net"
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
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// Restarter restarts containers through the shim's governed restart machinery
// (the restart-rules feature, with its backoff).
type Restarter interface {
	RestartContainer(ctx context.Context, sandboxID, container, reason string) error
	RestartPod(ctx context.Context, sandboxID, reason string) error
}

// QueueSize bounds a pod's undelivered notifications.
const QueueSize = 256

// Manager runs the channels of every pod that declares one.
type Manager struct {
	rt        runtimeapi.RuntimeServiceClient
	dir       string
	log       *slog.Logger
	restarter Restarter
	metrics   *metrics
	// dial connects to a sidecar (tests replace it).
	dial func(addr string) (*grpc.ClientConn, error)
	// backoff bounds between connection attempts.
	minBackoff, maxBackoff time.Duration

	ctx context.Context // Run's, for connectors started by routes

	mu   sync.Mutex
	pods map[string]*pod // sandbox ID
	// exitCodes indexes every pod's Overrides by container ID, for the
	// ContainerStatus route; overridden counts them, so that the route stays
	// on the raw path while no container has one.
	exitCodes  map[string]int32
	active     atomic.Int32
	overridden atomic.Int32
}

type pod struct {
	SandboxID string            `json:"sandboxId"`
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	UID       string            `json:"uid"`
	Decl      Declaration       `json:"declaration"`
	Overrides map[string]int32  `json:"overrides,omitempty"` // container ID -> exit code asked by TerminateContainer
	Names     map[string]string `json:"names,omitempty"`     // container ID -> name

	token       string
	queue       chan *pb.ContainerEvent
	dropped     atomic.Int64
	state       atomic.Value // string: waiting, connecting, connected, backoff
	terminating atomic.Bool
	cancel      context.CancelFunc
}

// New builds the manager; dir is the shim's state directory.
func New(rt runtimeapi.RuntimeServiceClient, stateDir string, restarter Restarter, log *slog.Logger) (*Manager, error) {
	dir := filepath.Join(stateDir, "podmgmt")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m := &Manager{rt: rt, dir: dir, log: log, restarter: restarter, metrics: newMetrics(),
		pods: map[string]*pod{}, exitCodes: map[string]int32{}, minBackoff: 200 * time.Millisecond, maxBackoff: 30 * time.Second,
		dial: func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p, err := m.load(e.Name())
		if err != nil {
			log.Warn("podmgmt: dropping an unreadable pod record", "sandbox", e.Name(), "err", err)
			os.RemoveAll(filepath.Join(dir, e.Name()))
			continue
		}
		m.pods[p.SandboxID] = p
		for id, code := range p.Overrides {
			m.exitCodes[id] = code
		}
	}
	m.active.Store(int32(len(m.pods)))
	m.overridden.Store(int32(len(m.exitCodes)))
	return m, nil
}

func (m *Manager) podDir(sandbox string) string { return filepath.Join(m.dir, sandbox) }
func (m *Manager) tokenPath(sandbox string) string {
	return filepath.Join(m.podDir(sandbox), "token")
}

func (m *Manager) load(sandbox string) (*pod, error) {
	b, err := os.ReadFile(filepath.Join(m.podDir(sandbox), "pod.json"))
	if err != nil {
		return nil, err
	}
	p := &pod{}
	if err := json.Unmarshal(b, p); err != nil {
		return nil, err
	}
	tok, err := os.ReadFile(m.tokenPath(sandbox))
	if err != nil {
		return nil, err
	}
	p.token = string(tok)
	p.init()
	return p, nil
}

func (p *pod) init() {
	p.queue = make(chan *pb.ContainerEvent, QueueSize)
	p.state.Store("waiting")
	if p.Overrides == nil {
		p.Overrides = map[string]int32{}
	}
	if p.Names == nil {
		p.Names = map[string]string{}
	}
}

// save writes the pod record; m.mu held.
func (m *Manager) save(p *pod) {
	b, err := json.Marshal(p)
	if err == nil {
		tmp := filepath.Join(m.podDir(p.SandboxID), "pod.json.tmp")
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, filepath.Join(m.podDir(p.SandboxID), "pod.json"))
		}
	}
	if err != nil {
		m.log.Error("podmgmt: saving pod record", "sandbox", p.SandboxID, "err", err)
	}
}

// Collectors are the channel metrics.
func (m *Manager) Collectors() []prometheus.Collector { return m.metrics.collectors() }

// Run follows container exits and keeps the channels of known pods until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	// Records of sandboxes removed while the shim was down are dropped.
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
			m.mu.Lock()
			delete(m.pods, p.SandboxID)
			m.active.Store(int32(len(m.pods)))
			m.mu.Unlock()
			os.RemoveAll(m.podDir(p.SandboxID))
			m.log.Info("podmgmt: dropped the channel record of a sandbox that no longer exists", "sandbox", p.SandboxID)
		}
	}
	m.mu.Lock()
	m.ctx = ctx
	for _, p := range m.pods {
		m.connectLocked(p)
	}
	m.mu.Unlock()
	<-ctx.Done()
}

// newPod registers a sandbox that declares a channel and writes its token.
func (m *Manager) newPod(sandbox string, md *runtimeapi.PodSandboxMetadata, d *Declaration) error {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return err
	}
	p := &pod{SandboxID: sandbox, Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid(), Decl: *d,
		token: hex.EncodeToString(buf)}
	p.init()
	if err := os.MkdirAll(m.podDir(sandbox), 0o700); err != nil {
		return err
	}
	// The file is bind-mounted read-only into the declared container, whose
	// user may not be root.
	if err := os.WriteFile(m.tokenPath(sandbox), []byte(p.token), 0o444); err != nil {
		return err
	}
	m.mu.Lock()
	m.pods[sandbox] = p
	m.active.Store(int32(len(m.pods)))
	m.save(p)
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

func (m *Manager) stop(p *pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
		p.cancel = nil
	}
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
		m.setState(p, "backoff")
		m.metrics.connected.WithLabelValues(p.Namespace, p.Name).Set(0)
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
	ip := sb.GetStatus().GetNetwork().GetIp()
	if ip == "" {
		ip = "127.0.0.1" // host network
	}
	conn, err := m.dial(net.JoinHostPort(ip, strconv.Itoa(p.Decl.Port)))
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
	m.metrics.connected.WithLabelValues(p.Namespace, p.Name).Set(1)
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

// setState records the channel's state, in memory and, on a change, in the
// pod's directory for `cri-shim pods`.
func (m *Manager) setState(p *pod, st string) {
	if old, _ := p.state.Swap(st).(string); old == st {
		return
	}
	line := fmt.Sprintf("%s %s dropped=%d\n", st, time.Now().UTC().Format(time.RFC3339), p.dropped.Load())
	_ = os.WriteFile(filepath.Join(m.podDir(p.SandboxID), "state"), []byte(line), 0o600)
}

// Channel is what `cri-shim pods` shows of a pod's channel.
type Channel struct {
	Namespace, Name, Container string
	Port                       int
	State                      string // state, since, drops, as last recorded
}

// ReadChannels reads the channel records under stateDir.
func ReadChannels(stateDir string) []Channel {
	dir := filepath.Join(stateDir, "podmgmt")
	ents, _ := os.ReadDir(dir)
	var out []Channel
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "pod.json"))
		if err != nil {
			continue
		}
		var p pod
		if json.Unmarshal(b, &p) != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join(dir, e.Name(), "state"))
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

// setExitCode records (or, with ok false, forgets) a requested exit code.
func (m *Manager) setExitCode(p *pod, id string, code int32, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ok {
		p.Overrides[id], m.exitCodes[id] = code, code
	} else {
		delete(p.Overrides, id)
		delete(m.exitCodes, id)
	}
	m.overridden.Store(int32(len(m.exitCodes)))
	m.save(p)
}

// sortEvents orders a state snapshot by time, so that a sidecar replaying it
// ends with the current picture.
func sortEvents(evs []*pb.ContainerEvent) {
	slices.SortStableFunc(evs, func(a, b *pb.ContainerEvent) int {
		return a.GetTime().AsTime().Compare(b.GetTime().AsTime())
	})
}
