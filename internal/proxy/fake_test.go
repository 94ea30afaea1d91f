package proxy

import (
	"context"
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

	"github.com/cri-shim/cri-shim/internal/metrics"
)

// fakeRuntime is an in-process CRI runtime on a real unix socket: the proxy
// under test talks to it exactly as it talks to containerd.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	lastMD       atomic.Pointer[metadata.MD]
	eventStreams atomic.Int32 // GetContainerEvents handlers currently running
	containers   []*runtimeapi.Container

	// barrier, when set, makes ListPodSandbox wait until that many calls are in flight.
	barrier   int32
	inBarrier atomic.Int32
	release   chan struct{}
	once      sync.Once
}

func (f *fakeRuntime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.lastMD.Store(&md)
	if req.Version == "fail" {
		st, _ := status.New(codes.FailedPrecondition, "fake: refusing version \"fail\"").
			WithDetails(wrapperspb.String("detail from the runtime"))
		return nil, st.Err()
	}
	if req.Version == "slow" {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "v9", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	out := f.containers
	if req.Filter != nil && req.Filter.Id != "" {
		out = nil
		for _, c := range f.containers {
			if c.Id == req.Filter.Id {
				out = append(out, c)
			}
		}
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (f *fakeRuntime) ListPodSandbox(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	if f.barrier > 0 {
		if f.inBarrier.Add(1) >= f.barrier {
			f.once.Do(func() { close(f.release) })
		}
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &runtimeapi.ListPodSandboxResponse{}, nil
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	f.eventStreams.Add(1)
	defer f.eventStreams.Add(-1)
	for i := 0; ; i++ {
		// Stamped with the present, as containerd stamps its events.
		if err := s.Send(&runtimeapi.ContainerEventResponse{ContainerId: "c" + string(rune('a'+i%26)), CreatedAt: time.Now().UnixNano()}); err != nil {
			return err
		}
		if i == 2 {
			// After three events, idle until the caller goes away.
			<-s.Context().Done()
			return s.Context().Err()
		}
	}
}

func (f *fakeRuntime) StreamContainers(_ *runtimeapi.StreamContainersRequest, s grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	for _, c := range f.containers {
		if err := s.Send(&runtimeapi.StreamContainersResponse{Containers: []*runtimeapi.Container{c}}); err != nil {
			return err
		}
	}
	return status.Error(codes.ResourceExhausted, "fake: stream ended by runtime")
}

// unknownHandler plays a runtime that knows methods this build of the shim does not.
func (f *fakeRuntime) unknownHandler(_ any, ss grpc.ServerStream) error {
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

// startFake serves a fakeRuntime on sock.
func startFake(t testing.TB, f *fakeRuntime, sock string) *grpc.Server {
	t.Helper()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnknownServiceHandler(f.unknownHandler), grpc.MaxSendMsgSize(64<<20))
	runtimeapi.RegisterRuntimeServiceServer(gs, f)
	runtimeapi.RegisterImageServiceServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return gs
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
	cc := dialSock(t, sock)
	t.Cleanup(func() { cc.Close(); gs.Stop(); backend.Close() })
	return cc, mc
}

func dialSock(t testing.TB, sock string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// fixture is a fake runtime, a direct client of it and a client through the proxy.
type fixture struct {
	fake    *fakeRuntime
	fakeSrv *grpc.Server
	direct  *grpc.ClientConn
	shim    *grpc.ClientConn
	mc      *metrics.Collector
	sock    string
}

func newFixture(t testing.TB, f *fakeRuntime, routes ...hookRoute) *fixture {
	t.Helper()
	if f == nil {
		f = &fakeRuntime{}
	}
	sock := filepath.Join(t.TempDir(), "runtime.sock")
	srv := startFake(t, f, sock)
	shim, mc := startProxy(t, sock, routes...)
	direct := dialSock(t, sock)
	t.Cleanup(func() { direct.Close() })
	return &fixture{fake: f, fakeSrv: srv, direct: direct, shim: shim, mc: mc, sock: sock}
}
