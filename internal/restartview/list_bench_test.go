package restartview_test

// The kubelet's relist through the restart view, measured against a bare
// pass-through in the same run: a node of 1,100 containers (100 running
// in pods without rules, 100 running in pods with a restart rule that the
// restart engine tracks, 900 created, spread over all 200 pods), as
// bench/proxybench builds it on a real node.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/metrics"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podstate"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartview"
)

const (
	benchRunning = 100 // pods without rules, one running container each
	benchTracked = 100 // pods with a restart rule, one running container each
	benchCreated = 900 // containers created, not started, over all the pods
)

// relistNode is the node of the benchmarks: the restart engine and its
// view, tracking benchTracked pods, and the runtime's encoded answer to
// an unfiltered ListContainers.
type relistNode struct {
	view *restartview.View
	list []byte
}

func newRelistNode(b *testing.B) *relistNode {
	b.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt := fakeruntime.Start(b)
	cri := rt.Client()
	m, err := podstate.New(cri, b.TempDir(), backoff.NewTracker(backoff.Curve{Initial: 10 * time.Second, Max: 300 * time.Second}, nil), log, podstate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	adm := podtable.Admissions{Features: []podtable.Admitter{m}, RT: cri, Log: log}
	rules := map[string]string{podspec.RestartRulesPrefix + "sleeper": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`}
	type pod struct {
		id  string
		cfg *runtimeapi.PodSandboxConfig
	}
	var pods []pod
	for i := range benchRunning + benchTracked {
		tracked := i >= benchRunning
		cfg := &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprintf("sleeper-%d", i), Namespace: "bench", Uid: fmt.Sprintf("0b5e1c7a-0000-4000-8000-%012d", i)},
			Labels: map[string]string{"io.kubernetes.pod.name": fmt.Sprintf("sleeper-%d", i), "io.kubernetes.pod.namespace": "bench",
				"io.kubernetes.pod.uid": fmt.Sprintf("0b5e1c7a-0000-4000-8000-%012d", i)},
			LogDirectory: "/var/log/pods/bench_sleeper",
		}
		var sb string
		if tracked {
			cfg.Annotations = rules
			resp, err := adm.Run(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg}, func(ctx context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
				return cri.RunPodSandbox(ctx, r)
			})
			if err != nil {
				b.Fatal(err)
			}
			sb = resp.PodSandboxId
		} else {
			resp, err := cri.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			sb = resp.PodSandboxId
		}
		pods = append(pods, pod{sb, cfg})
		req := containerReq(sb, cfg, "sleeper")
		var id string
		if tracked {
			resp, err := m.CreateContainer(ctx, req, func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				return cri.CreateContainer(ctx, r)
			})
			if err != nil {
				b.Fatal(err)
			}
			id = resp.ContainerId
		} else {
			resp, err := cri.CreateContainer(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			id = resp.ContainerId
		}
		if _, err := cri.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range benchCreated {
		p := pods[i%len(pods)]
		if _, err := cri.CreateContainer(ctx, containerReq(p.id, p.cfg, fmt.Sprintf("extra-%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	if m.Tracked() != benchTracked {
		b.Fatalf("the engine tracks %d pods, want %d", m.Tracked(), benchTracked)
	}
	resp, err := cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		b.Fatal(err)
	}
	if n := len(resp.Containers); n != benchRunning+benchTracked+benchCreated {
		b.Fatalf("the runtime lists %d containers", n)
	}
	list, err := proto.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	v := restartview.New(m, nil, log)
	return &relistNode{view: v, list: list}
}

// containerReq is a CreateContainer as the kubelet sends it, with the
// labels and annotations kuberuntime puts on every container (they make
// up most of a listed entry).
func containerReq(sb string, cfg *runtimeapi.PodSandboxConfig, name string) *runtimeapi.CreateContainerRequest {
	md := cfg.GetMetadata()
	return &runtimeapi.CreateContainerRequest{PodSandboxId: sb, SandboxConfig: cfg, Config: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: fakeruntime.NodeImages[1]},
		Labels: map[string]string{"io.kubernetes.container.name": name, "io.kubernetes.pod.name": md.Name,
			"io.kubernetes.pod.namespace": md.Namespace, "io.kubernetes.pod.uid": md.Uid},
		Annotations: map[string]string{"io.kubernetes.container.hash": "5d8a4f2c", "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log", "io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod": "30"},
		LogPath: name + "/0.log",
	}}
}

// BenchmarkListContainersFrames is the view's own work on one relist (the
// runtime's answer is at hand, in 16 KiB frames as gRPC receives it):
// what the shim adds to the bare forwarder's relay of the same buffers,
// per call.
func BenchmarkListContainersFrames(b *testing.B) {
	n := newRelistNode(b)
	ctx := context.Background()
	var frames [][]byte
	for rest := n.list; len(rest) > 0; {
		k := min(len(rest), 16<<10)
		frames, rest = append(frames, rest[:k]), rest[k:]
	}
	next := func(context.Context, []byte) ([][]byte, error) { return frames, nil }
	b.ReportAllocs()
	b.SetBytes(int64(len(n.list)))
	for b.Loop() {
		_, asIs, err := n.view.ListContainersFrames(ctx, nil, next)
		if err != nil {
			b.Fatal(err)
		}
		if !asIs {
			b.Fatal("the view changed a list it has nothing to edit in")
		}
	}
}

// BenchmarkRelist is the relist end to end over unix sockets: a runtime
// that answers every ListContainers with the node's encoded list, a proxy
// without features (the bare forwarder: frames relayed undecoded) and the
// proxy with the restart view, called alternately in one run. shim/bare
// is the ratio of their times per call (1.0: the floor).
func BenchmarkRelist(b *testing.B) {
	n := newRelistNode(b)
	rtSock := serveList(b, n.list)
	bare := serveProxy(b, rtSock)
	shim := serveProxy(b, rtSock, n.view)
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			var mu sync.Mutex
			var tBare, tShim time.Duration
			calls := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, conc)
			for w := range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var db, ds time.Duration
					for range calls {
						// The order alternates so neither side always runs on a warm cache.
						first, second := bare, shim
						if w%2 == 1 {
							first, second = shim, bare
						}
						d1, err := relist(first)
						if err == nil {
							var d2 time.Duration
							d2, err = relist(second)
							if w%2 == 1 {
								d1, d2 = d2, d1
							}
							db, ds = db+d1, ds+d2
						}
						if err != nil {
							errs <- err
							return
						}
					}
					mu.Lock()
					tBare, tShim = tBare+db, tShim+ds
					mu.Unlock()
				}()
			}
			b.ReportAllocs()
			for b.Loop() {
				select {
				case calls <- struct{}{}:
				case err := <-errs:
					b.Fatal(err)
				}
			}
			close(calls)
			wg.Wait()
			b.ReportMetric(float64(tShim)/float64(tBare), "shim/bare")
			b.ReportMetric(float64(tBare.Microseconds())/float64(b.N), "bare-µs/call")
			b.ReportMetric(float64(tShim.Microseconds())/float64(b.N), "shim-µs/call")
		})
	}
}

// relist is one unfiltered ListContainers on cc, and how long it took.
func relist(cc *grpc.ClientConn) (time.Duration, error) {
	start := time.Now()
	var out rawMsg
	err := cc.Invoke(context.Background(), "/runtime.v1.RuntimeService/ListContainers", &rawMsg{}, &out)
	d := time.Since(start)
	if err == nil && len(out.b) == 0 {
		err = fmt.Errorf("empty list")
	}
	return d, err
}

// rawMsg is a message as its encoded bytes: the benchmark's runtime
// answers with the same bytes every time, and its client reads them
// without decoding, so the measure is the proxies' work alone.
type rawMsg struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMsg)
	if !ok {
		return nil, fmt.Errorf("raw codec: %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMsg)
	if !ok {
		return fmt.Errorf("raw codec: %T", v)
	}
	m.b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// serveList serves a runtime that answers every call with list.
func serveList(b *testing.B, list []byte) string {
	b.Helper()
	sock := filepath.Join(b.TempDir(), "runtime.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.MaxSendMsgSize(64<<20),
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			var req rawMsg
			if err := ss.RecvMsg(&req); err != nil {
				return err
			}
			return ss.SendMsg(&rawMsg{b: list})
		}))
	go func() { _ = gs.Serve(lis) }()
	b.Cleanup(gs.Stop)
	return sock
}

// serveProxy serves the shim's proxy with features in front of the
// runtime at rtSock, with the server options the shim runs with, and
// returns a raw client of it.
func serveProxy(b *testing.B, rtSock string, features ...any) *grpc.ClientConn {
	b.Helper()
	backend, err := proxy.DialBackend("unix://"+rtSock, proxy.BackendOptions{MaxRecvMsgSize: 64 << 20, MaxSendMsgSize: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	p, err := proxy.New(backend, metrics.New(proxy.CRIMethods()), features...)
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(b.TempDir(), "shim.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(append(p.ServerOptions(), grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20), grpc.SharedWriteBuffer(true))...)
	go func() { _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close(); gs.Stop(); backend.Close() })
	return cc
}
