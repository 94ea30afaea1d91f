package podmgmt

// The test fixture: a manager over the shared fake runtime, a recording
// restarter, and helpers that drive the kubelet's calls and a sidecar.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/store"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

type restarts struct {
	mu    sync.Mutex
	calls []string
	// holdErr fails HoldContainer.
	holdErr error
}

func (r *restarts) HoldContainer(_ context.Context, sb, c string, hold bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holdErr != nil {
		return r.holdErr
	}
	r.calls = append(r.calls, fmt.Sprintf("hold:%s:%v", c, hold))
	return nil
}

func (r *restarts) restartCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		if !strings.HasPrefix(c, "hold:") {
			out = append(out, c)
		}
	}
	return out
}

func (r *restarts) RestartContainer(_ context.Context, sb, c, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "container:"+c)
	return nil
}

func (r *restarts) RestartPod(_ context.Context, sb, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "pod:"+reason)
	return nil
}

type fx struct {
	rt   *fakeruntime.Runtime
	m    *Manager
	port int
	r    *restarts
	// attempts counts the containers created per name, for their attempt
	// numbers: the runtime refuses a name and attempt it already holds.
	attempts map[string]uint32
	// sandboxOps are the StopPodSandbox and RemovePodSandbox calls the
	// runtime received, in order ("stop sb2").
	opsMu      sync.Mutex
	sandboxOps []string
}

// sbConfig is the configuration of sandbox "sb".
func sbConfig(port int) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "u"},
		Annotations: map[string]string{podspec.PodManagementPrefix + "orch": `{"port": ` + strconv.Itoa(port) + `, "version": "1.0"}`}}
}

func (f *fx) ops() []string {
	f.opsMu.Lock()
	defer f.opsMu.Unlock()
	return append([]string(nil), f.sandboxOps...)
}

// stopped are the IDs of the StopContainer calls the runtime received.
func (f *fx) stopped() []string {
	var ids []string
	for _, r := range f.rt.Requests("StopContainer") {
		ids = append(ids, r.(*runtimeapi.StopContainerRequest).ContainerId)
	}
	return ids
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newFx: a pod "sb" declaring container "orch" on a free port, the manager running.
func newFx(t *testing.T) *fx {
	t.Helper()
	// The fake pods live on 127.0.0.1, where the test's sidecars listen.
	f := &fx{rt: fakeruntime.Start(t, fakeruntime.WithPodIP(func(int) string { return "127.0.0.1" })), port: freePort(t), r: &restarts{},
		attempts: map[string]uint32{}}
	for _, op := range []string{"StopPodSandbox", "RemovePodSandbox"} {
		f.rt.OnCall(op, func(_ context.Context, method string, req any) error {
			f.opsMu.Lock()
			defer f.opsMu.Unlock()
			verb := map[string]string{"StopPodSandbox": "stop ", "RemovePodSandbox": "remove "}[method]
			f.sandboxOps = append(f.sandboxOps, verb+req.(interface{ GetPodSandboxId() string }).GetPodSandboxId())
			return nil
		})
	}
	dir := t.TempDir()
	st := openStore(t, dir)
	m, err := New(f.rt.Client(), dir, st, f.r, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	st.Subscribe(m.SandboxGone) // as the server wires it
	m.minBackoff, m.maxBackoff = 20*time.Millisecond, 100*time.Millisecond
	m.checkAddr = func(netip.Addr) error { return nil } // the fake pods live on 127.0.0.1: allowed here
	f.m = m
	ctx := runManager(t, m, context.Background())
	f.rt.NextIDs("sb")
	if _, err = admissions(m, f.rt).Run(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbConfig(f.port)}, fwd(f.rt.Client().RunPodSandbox)); err != nil {
		t.Fatal(err)
	}
	return f
}

// admissions is the pod table's admission with the manager alone.
func admissions(m *Manager, rt *fakeruntime.Runtime) podtable.Admissions {
	return podtable.Admissions{Features: []podtable.Admitter{m}, RT: rt.Client(), Log: m.log}
}

// fwd is a runtime client's call as the next step of a hook: the call
// forwarded to the runtime.
func fwd[Req, Resp any](call func(context.Context, *Req, ...grpc.CallOption) (*Resp, error)) func(context.Context, *Req) (*Resp, error) {
	return func(ctx context.Context, req *Req) (*Resp, error) { return call(ctx, req) }
}

// createReq is the kubelet's CreateContainer of container name in "sb",
// with the next attempt number of that name.
func (f *fx) createReq(name string) *runtimeapi.CreateContainerRequest {
	attempt := f.attempts[name]
	f.attempts[name]++
	return &runtimeapi.CreateContainerRequest{PodSandboxId: "sb", SandboxConfig: sbConfig(f.port),
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
			Image: &runtimeapi.ImageSpec{Image: fakeruntime.NodeImages[1]}}}
}

// direct creates and starts container id (named name) in "sb" at the
// runtime, without the shim seeing it.
func (f *fx) direct(t *testing.T, id, name string) {
	t.Helper()
	ctx := context.Background()
	f.rt.NextIDs(id)
	if _, err := f.rt.Client().CreateContainer(ctx, f.createReq(name)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.Client().StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
}

// exit makes container id's process exit with code at the runtime.
func (f *fx) exit(t *testing.T, id string, code int32) {
	t.Helper()
	if err := f.rt.Exit(id, code); err != nil {
		t.Fatal(err)
	}
}

// create and start a container through the routes, as the kubelet would.
func (f *fx) run(t *testing.T, id, name string) *runtimeapi.CreateContainerRequest {
	t.Helper()
	req := f.createReq(name)
	ctx := context.Background()
	f.rt.NextIDs(id)
	if _, err := f.m.CreateContainer(ctx, req, fwd(f.rt.Client().CreateContainer)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := f.m.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}, fwd(f.rt.Client().StartContainer)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("StartContainer of %s took %s: the channel must never be on a CRI call's path", name, d)
	}
	f.event(t, id, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	return req
}

// event feeds the manager a runtime event for a container of "sb" as
// containerd sends it: the sandbox's status and every container's.
func (f *fx) event(t *testing.T, id string, typ runtimeapi.ContainerEventType) {
	t.Helper()
	ctx := context.Background()
	ev := &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ}
	sb, err := f.rt.Client().PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	ev.PodSandboxStatus = sb.Status
	list, err := f.rt.Client().ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: "sb"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Containers {
		st, err := f.rt.Client().ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil {
			t.Fatal(err)
		}
		ev.ContainersStatuses = append(ev.ContainersStatuses, st.Status)
	}
	b, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	f.m.OnEvent(e)
}

func (f *fx) sidecar(t *testing.T, token string) (*podmanagement.Sidecar, func()) {
	t.Helper()
	if token == "" {
		b, err := os.ReadFile(f.m.tokenPath("sb"))
		if err != nil {
			t.Fatal(err)
		}
		token = string(b)
	}
	sc, err := podmanagement.New(podmanagement.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(f.port))
	if err != nil {
		t.Fatal(err)
	}
	go sc.Serve(lis)
	return sc, sc.Stop
}

func next(t *testing.T, sc *podmanagement.Sidecar) *pb.ContainerEvent {
	t.Helper()
	select {
	case ev := <-sc.Events():
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
		return nil
	}
}

// stopConnector cancels a pod's connector, as the end of its shim would.
func (m *Manager) stopConnector(p *pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
		p.cancel = nil
	}
}

// runManager runs m under a context of parent until the test ends, and
// returns once Run has set up its channels. The test's cleanup ends Run and
// waits for it to return (with every connector it started), before the
// temporary directories go.
func runManager(t *testing.T, m *Manager, parent context.Context) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for !m.isRunning() {
		time.Sleep(time.Millisecond)
	}
	return ctx
}

func (m *Manager) isRunning() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.serving
}

// openStore opens the state store of the shim whose state directory is dir.
func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(store.RootIn(dir))
	if err != nil {
		t.Fatal(err)
	}
	return st
}
