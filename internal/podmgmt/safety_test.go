package podmgmt

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// listener counts the connections made to a port on 127.0.0.1 (what a
// process on the host listening there would receive).
func listener(t *testing.T, port int) *atomic.Int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return &n
}

func runSandbox(t *testing.T, m *Manager, rt *fakeruntime.Runtime, id string, port int, hostNet bool) (*runtimeapi.RunPodSandboxResponse, error) {
	t.Helper()
	cfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p-" + id, Namespace: "ns", Uid: "u-" + id},
		Annotations: map[string]string{podspec.PodManagementPrefix + "orch": `{"port": ` + strconv.Itoa(port) + `, "version": "1.0"}`}}
	if hostNet {
		cfg.Linux = &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}
	}
	rt.NextIDs(id)
	return admissions(m, rt).Run(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg}, fwd(rt.Client().RunPodSandbox))
}

// A host-network pod that declares an orchestrator gets no channel: nothing
// is dialled on the host, the refusal is counted. A record of such a pod from
// an earlier shim (no check at RunPodSandbox then) is refused at connect time.
func TestHostNetworkPodGetsNoChannel(t *testing.T) {
	f := newFx(t)
	port := freePort(t)
	conns := listener(t, port)
	if _, err := runSandbox(t, f.m, f.rt, "hostnet", port, true); err != nil {
		t.Fatal(err)
	}
	if f.m.get("hostnet") != nil {
		t.Fatal("a host-network pod got a channel")
	}
	if _, err := os.Stat(f.m.tokenDir("hostnet")); !os.IsNotExist(err) {
		t.Fatalf("a host-network pod got a record (and a token): %v", err)
	}
	if n := testutil.ToFloat64(f.m.metrics.refused.WithLabelValues("host_network")); n != 1 {
		t.Fatalf("refusals counted %v, want 1", n)
	}
	// The recorded pod "sb" turns out to be on the host's network (as a
	// record written before this check would be).
	f.rt.Rewrite("PodSandboxStatus", func(m proto.Message) {
		m.(*runtimeapi.PodSandboxStatusResponse).Status.Linux.Namespaces.Options = &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}
	})
	hostConns := listener(t, f.port)
	f.run(t, "o1", "orch")
	p := f.m.get("sb")
	eventually(t, func() bool { st, _ := p.state.Load().(string); return st == "refused(host_network)" })
	// The pod's connector has ended: nothing is tried again.
	ended := make(chan struct{})
	go func() { f.m.connectors.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the refused pod's connector still runs: it would try again")
	}
	if n := conns.Load() + hostConns.Load(); n != 0 {
		t.Fatalf("%d connections made to the host's 127.0.0.1", n)
	}
	if n := testutil.ToFloat64(f.m.metrics.refused.WithLabelValues("host_network")); n != 2 {
		t.Fatalf("refusals counted %v, want 2", n)
	}
	if ch := ReadChannels(filepath.Dir(f.m.dir)); len(ch) != 1 || !strings.HasPrefix(ch[0].State, "refused(host_network)") {
		t.Fatalf("cri-shim pods would show %+v", ch)
	}
}

// A pod whose IP is not known yet is waited for; nothing is dialled meanwhile
// (no fallback to the host's loopback).
func TestNoPodIPIsWaitedFor(t *testing.T) {
	f := newFx(t)
	f.rt.Rewrite("PodSandboxStatus", func(m proto.Message) { m.(*runtimeapi.PodSandboxStatusResponse).Status.Network.Ip = "" })
	calls := f.rt.Calls("PodSandboxStatus")
	conns := listener(t, f.port)
	f.run(t, "o1", "orch")
	eventually(t, func() bool {
		return f.rt.Calls("PodSandboxStatus") >= calls+3 // retried, with backoff
	})
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections to 127.0.0.1 while the pod had no IP", n)
	}
	if st, _ := f.m.get("sb").state.Load().(string); st == "connected" || strings.HasPrefix(st, "refused") {
		t.Fatalf("state %s, want still trying", st)
	}
}

func TestPodAddrRefusesHostAddresses(t *testing.T) {
	m := &Manager{checkAddr: podAddressOK}
	ready := func(ip string) *runtimeapi.PodSandboxStatus {
		return &runtimeapi.PodSandboxStatus{State: runtimeapi.PodSandboxState_SANDBOX_READY, Network: &runtimeapi.PodSandboxNetworkStatus{Ip: ip}}
	}
	refused := []string{"127.0.0.1", "127.3.4.5", "::1", "0.0.0.0", "::", "224.0.0.1", "::ffff:127.0.0.1", "not-an-ip"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
				refused = append(refused, n.IP.String()) // the host's own
			}
		}
	}
	for _, ip := range refused {
		_, err := m.podAddr(ready(ip), 50051)
		if r := (*refusal)(nil); !errors.As(err, &r) {
			t.Errorf("pod IP %s: %v, want a refusal", ip, err)
		}
	}
	for _, st := range []*runtimeapi.PodSandboxStatus{ready(""), {State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY, Network: &runtimeapi.PodSandboxNetworkStatus{Ip: "192.0.2.7"}}} {
		if _, err := m.podAddr(st, 50051); err == nil || errors.As(err, new(*refusal)) {
			t.Errorf("%v: %v, want an error to retry", st, err)
		}
	}
	if a, err := m.podAddr(ready("192.0.2.7"), 50051); err != nil || a != "192.0.2.7:50051" {
		t.Fatalf("a pod IP: %q %v", a, err)
	}
	if a, err := m.podAddr(ready("2001:db8::7"), 50051); err != nil || a != "[2001:db8::7]:50051" {
		t.Fatalf("a pod IPv6: %q %v", a, err)
	}
	hostNet := ready("192.0.2.7")
	hostNet.Linux = &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}
	if _, err := m.podAddr(hostNet, 50051); !errors.Is(err, errHostNetwork) {
		t.Fatalf("host-network sandbox: %v", err)
	}
}

// StopPodSandbox closes the channel even when the runtime fails the call,
// and the pod stays terminating across a shim restart: no reconnect, no
// command carried out.
func TestTerminatingStopsConnectorAndSurvivesRestart(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	f.run(t, "m1", "main")
	sc, stop := f.sidecar(t, "")
	next(t, sc)
	ctx := context.Background()
	_, err := f.m.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "sb"},
		func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			return nil, status.Error(codes.DeadlineExceeded, "runtime slow")
		})
	if status.Code(proxy.Status(err)) != codes.DeadlineExceeded {
		t.Fatalf("the runtime's error was not passed on: %v", err)
	}
	stop()
	// A sidecar listening again is never called: the connector is gone.
	sc2, stop2 := f.sidecar(t, "")
	defer stop2()
	expectSilence := func(what string) {
		t.Helper()
		select {
		case ev := <-sc2.Events():
			t.Fatalf("%s: delivered %v to a terminating pod", what, ev)
		case <-time.After(300 * time.Millisecond):
		}
	}
	expectSilence("after a failed StopPodSandbox")
	// A restarted shim: still terminating.
	m2, err := New(f.rt.Client(), filepath.Dir(f.m.dir), openStore(t, filepath.Dir(f.m.dir)), f.r, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	m2.checkAddr = f.m.checkAddr
	f.m.stopConnector(f.m.get("sb"))
	p := m2.get("sb")
	if p == nil || !p.terminating.Load() {
		t.Fatal("the terminating mark was lost across a restart")
	}
	runManager(t, m2, ctx)
	expectSilence("after a shim restart")
	f.direct(t, "m2", "main")
	for _, c := range []*pb.Command{
		{Command: &pb.Command_TerminateContainer{TerminateContainer: &pb.TerminateContainerCommand{ContainerName: "main"}}},
		{Command: &pb.Command_RestartContainer{RestartContainer: &pb.RestartContainerCommand{ContainerName: "main"}}},
	} {
		if _, r := m2.do(ctx, p, c); r.Result != pb.CommandResult_REFUSED {
			t.Fatalf("%v carried out in a terminating pod: %v", c, r)
		}
	}
	if s := f.stopped(); len(s) != 0 {
		t.Fatalf("stopped %v", s)
	}
}

// The token is never readable with a wider or narrower mode than its final
// one, and no temporary file is left.
func TestTokenFileMode(t *testing.T) {
	f := newFx(t)
	fi, err := os.Stat(f.m.tokenPath("sb"))
	if err != nil || fi.Mode().Perm() != 0o444 {
		t.Fatalf("token: %v %v", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(f.m.tokenDir("sb"))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
}

// Every per-pod map shrinks back to nothing: instances removed from a live
// pod, sandboxes removed through the shim (also when the runtime already
// forgot them), and sandboxes removed behind its back.
func TestMapsShrinkAfterChurn(t *testing.T) {
	f := newFx(t)
	ctx := context.Background()
	baseline := runtime.NumGoroutine()
	createNext := func(id string) func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		return func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
		}
	}
	removeCtr := func(id string) {
		if _, err := f.m.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id},
			func(context.Context, *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
				return &runtimeapi.RemoveContainerResponse{}, nil
			}); err != nil {
			t.Fatal(err)
		}
	}
	// A live pod whose orchestrator and main are recreated many times.
	p := f.m.get("sb")
	for i := range 300 {
		id := "o" + strconv.Itoa(i)
		if _, err := f.m.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "sb", Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "orch"}}}, createNext(id)); err != nil {
			t.Fatal(err)
		}
		mid := "m" + strconv.Itoa(i)
		if err := f.m.setExitCode(p, mid, 3, true); err != nil {
			t.Fatal(err)
		}
		removeCtr(id)
		removeCtr(mid)
	}
	// Sandboxes created and removed: through the shim, through the shim
	// after the runtime already removed them, behind the shim's back. The
	// pod table announces each gone (internal/podtable).
	table := podtable.New(f.rt.Client(), f.m.store, f.m.log)
	for i := range 300 {
		id := "s" + strconv.Itoa(i)
		if _, err := runSandbox(t, f.m, f.rt, id, 1000+i, false); err != nil {
			t.Fatal(err)
		}
		f.m.mu.Lock()
		f.m.connectLocked(f.m.pods[id])
		f.m.mu.Unlock()
		if _, err := f.m.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: id, Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "orch"}}}, createNext("c"+id)); err != nil {
			t.Fatal(err)
		}
		if err := f.m.setExitCode(f.m.get(id), "x"+id, 1, true); err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 0, 1:
			_, err := table.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id},
				func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
					if i%3 == 1 {
						return nil, status.Error(codes.NotFound, "already removed")
					}
					return &runtimeapi.RemovePodSandboxResponse{}, nil
				})
			if err != nil && status.Code(err) != codes.NotFound {
				t.Fatal(err)
			}
		case 2: // behind the shim's back
			if _, err := f.rt.Client().RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := table.Sync(ctx); err != nil { // the relist finds those removed behind the shim's back
		t.Fatal(err)
	}
	f.m.mu.Lock()
	sizes := map[string]int{"pods": len(f.m.pods), "exitCodes": len(f.m.exitCodes), "orch": len(f.m.orch),
		"sb.overrides": len(p.Overrides), "sb.orchIDs": len(p.orchIDs)}
	f.m.mu.Unlock()
	want := map[string]int{"pods": 1, "exitCodes": 0, "orch": 0, "sb.overrides": 0, "sb.orchIDs": 0}
	for k, v := range want {
		if sizes[k] != v {
			t.Errorf("%s: %d entries, want %d", k, sizes[k], v)
		}
	}
	if a, o := f.m.active.Load(), f.m.overridden.Load(); a != 1 || o != 0 {
		t.Errorf("active %d overridden %d", a, o)
	}
	if ents, _ := os.ReadDir(f.m.dir); len(ents) != 1 {
		t.Errorf("%d records on disk, want 1", len(ents))
	}
	if n := testutil.CollectAndCount(f.m.metrics.connected); n > 1 {
		t.Errorf("%d connected series, want at most the live pod's", n)
	}
	eventually(t, func() bool { return runtime.NumGoroutine() <= baseline+2 })
}
