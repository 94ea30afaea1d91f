package proxy

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/metrics"
)

// The proxy's tests run against the shared fake runtime (internal/fakeruntime)
// with a few scripted answers of their own, set up by startRuntime:
//   - Version "fail" is refused with FailedPrecondition and a detail, and
//     Version "slow" takes 5 s unless its caller gives up first;
//   - the runtime knows methods this build does not (unknownHandler);
//   - StreamContainers streams the containers one by one, then ends with
//     ResourceExhausted (containerd 2.2 does not implement it).

// scripted is what the scripted answers saw.
type scripted struct {
	lastMD atomic.Pointer[metadata.MD] // metadata of the last Version call
}

// streamingRuntime is the fake runtime with StreamContainers.
type streamingRuntime struct{ *fakeruntime.Runtime }

func (r streamingRuntime) StreamContainers(req *runtimeapi.StreamContainersRequest, s grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	list, err := r.ListContainers(s.Context(), &runtimeapi.ListContainersRequest{Filter: req.Filter})
	if err != nil {
		return err
	}
	for _, c := range list.Containers {
		if err := s.Send(&runtimeapi.StreamContainersResponse{Containers: []*runtimeapi.Container{c}}); err != nil {
			return err
		}
	}
	return status.Error(codes.ResourceExhausted, "fake: stream ended by runtime")
}

// unknownHandler plays a runtime that knows methods this build of the shim does not.
func unknownHandler(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	switch method {
	case "/runtime.v1.RuntimeService/FutureEcho":
		// Unary as far as the client is concerned: one message in, one out.
		var in wrapperspb.StringValue
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		return ss.SendMsg(wrapperspb.String("future:" + in.Value))
	case "/future.v1.Chat/Talk":
		// Bidirectional: answer each message until the client half-closes.
		for {
			var in wrapperspb.StringValue
			if err := ss.RecvMsg(&in); err != nil {
				return nil
			}
			if err := ss.SendMsg(wrapperspb.String("re:" + in.Value)); err != nil {
				return err
			}
		}
	}
	return status.Errorf(codes.Unimplemented, "fake runtime: unknown method %s", method)
}

// startRuntime serves the fake runtime with the proxy tests' scripted answers on sock.
func startRuntime(t testing.TB, sock string) (*fakeruntime.Runtime, *scripted) {
	t.Helper()
	rt := fakeruntime.New(fakeruntime.WithServerOptions(grpc.UnknownServiceHandler(unknownHandler)),
		fakeruntime.WithRuntimeService(func(r *fakeruntime.Runtime) runtimeapi.RuntimeServiceServer { return streamingRuntime{r} }))
	sc := &scripted{}
	rt.OnCall("Version", func(ctx context.Context, _ string, req any) error {
		md, _ := metadata.FromIncomingContext(ctx)
		sc.lastMD.Store(&md)
		switch req.(*runtimeapi.VersionRequest).Version {
		case "fail":
			st, _ := status.New(codes.FailedPrecondition, "fake: refusing version \"fail\"").
				WithDetails(wrapperspb.String("detail from the runtime"))
			return st.Err()
		case "slow":
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Second):
			}
		}
		return nil
	})
	rt.ServeAt(t, sock)
	return rt, sc
}

// barrier makes ListPodSandbox wait until n calls are in the runtime at once.
func barrier(rt *fakeruntime.Runtime, n int32) {
	var in atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	rt.OnCall("ListPodSandbox", func(ctx context.Context, _ string, _ any) error {
		if in.Add(1) >= n {
			once.Do(func() { close(release) })
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// startProxy serves a Proxy in front of backendSock and returns a client of it.
func startProxy(t testing.TB, backendSock string, routes ...hookRoute) (*grpc.ClientConn, *metrics.Collector) {
	t.Helper()
	backend, err := DialBackend("unix://"+backendSock, BackendOptions{MaxRecvMsgSize: 16 << 20, MaxSendMsgSize: 16 << 20, ReconnectMaxDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mc := metrics.New(CRIMethods())
	p, err := newWithRoutes(backend, mc, routes)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "shim.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(p.ServerOptions(), grpc.MaxRecvMsgSize(16<<20), grpc.MaxSendMsgSize(16<<20))...)
	go func() { _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); gs.Stop(); backend.Close() })
	return cc, mc
}

// fixture is the fake runtime, a direct client of it and a client through the proxy.
type fixture struct {
	rt     *fakeruntime.Runtime
	sc     *scripted
	direct *grpc.ClientConn
	shim   *grpc.ClientConn
	mc     *metrics.Collector
}

func newFixture(t testing.TB, routes ...hookRoute) *fixture {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "runtime.sock")
	rt, sc := startRuntime(t, sock)
	shim, mc := startProxy(t, sock, routes...)
	return &fixture{rt: rt, sc: sc, direct: rt.Conn, shim: shim, mc: mc}
}

// runPod runs a sandbox on the runtime directly, named after n.
func (fx *fixture) runPod(t testing.TB, n int, labels map[string]string) (string, *runtimeapi.PodSandboxConfig) {
	t.Helper()
	cfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprint("p", n), Namespace: "ns", Uid: fmt.Sprint("u", n)},
		Labels: labels}
	resp, err := fx.rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return resp.PodSandboxId, cfg
}

// addContainer creates container name in sandbox sb on the runtime directly,
// started when running.
func (fx *fixture) addContainer(t testing.TB, sb string, sbCfg *runtimeapi.PodSandboxConfig, name string, labels map[string]string, running bool) string {
	t.Helper()
	ctx := context.Background()
	resp, err := fx.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb, SandboxConfig: sbCfg,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Labels: labels,
			Image: &runtimeapi.ImageSpec{Image: fakeruntime.NodeImages[1]}}})
	if err != nil {
		t.Fatal(err)
	}
	if running {
		if _, err := fx.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
	return resp.ContainerId
}

// metricValue is the value of the series of family name whose label values
// are labels (in the order of the labels' names, as Gather sorts them), read from mc's registry; -1 when
// there is none.
func metricValue(t *testing.T, mc *metrics.Collector, name string, labels ...string) float64 {
	t.Helper()
	fams, err := mc.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != labels[i] {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}
