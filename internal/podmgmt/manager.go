package podmgmt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/store"
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

	// connectors counts the running connectors; Run waits for them before
	// it returns. serving (m.mu) is set while Run runs: connectors start
	// only then, and Run's end cancels them.
	connectors sync.WaitGroup
	serving    bool

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
	SandboxID string               `json:"sandboxId"`
	Namespace string               `json:"namespace"`
	Name      string               `json:"name"`
	UID       string               `json:"uid"`
	Decl      podspec.Orchestrator `json:"declaration"`
	Overrides map[string]int32     `json:"overrides,omitempty"` // container ID -> exit code asked by TerminateContainer
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
// stateDir/podmgmt.
func New(rt runtimeapi.RuntimeServiceClient, stateDir string, st *store.Store, restarter Restarter, log *slog.Logger) (*Manager, error) {
	dir := filepath.Join(stateDir, "podmgmt")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m := &Manager{rt: rt, dir: dir, store: st, log: log, restarter: restarter, metrics: newMetrics(), checkAddr: podAddressOK,
		pods: map[string]*pod{}, exitCodes: map[string]int32{}, orch: map[string]string{},
		minBackoff: 200 * time.Millisecond, maxBackoff: 30 * time.Second,
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
	return m, nil
}

// SandboxGone forgets a sandbox the pod table announced gone (the server
// subscribes it to the store's lifecycle): its channel ends and its record
// is removed.
func (m *Manager) SandboxGone(id string) {
	if err := m.drop(id); err != nil {
		m.log.Warn("podmgmt: removing the record of a sandbox that is gone", "sandbox", id, "err", err)
	}
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

// Run keeps the channels of known pods until ctx ends. It returns once
// every connector has ended: nothing of a channel (its state line, a command
// it carries out) runs afterwards. Sandboxes that are gone are the pod
// table's (internal/podtable): it announces them on the store's lifecycle,
// and SandboxGone forgets them.
func (m *Manager) Run(ctx context.Context) {
	m.mu.Lock()
	m.serving = true
	for _, p := range m.pods {
		m.connectLocked(p)
	}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	m.serving = false
	for _, p := range m.pods {
		if p.cancel != nil {
			p.cancel()
		}
	}
	m.mu.Unlock()
	m.connectors.Wait()
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
func (m *Manager) newPod(sandbox string, md *runtimeapi.PodSandboxMetadata, d *podspec.Orchestrator) error {
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
