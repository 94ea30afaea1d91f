package fakeruntime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime is the fake CRI runtime: a RuntimeServiceServer and an
// ImageServiceServer over an in-memory store of sandboxes and containers.
type Runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	// Sock is the unix socket Start serves on; Conn is a client of it.
	Sock string
	Conn *grpc.ClientConn

	opts   options
	events *eventQueue
	gs     *grpc.Server

	mu          sync.Mutex
	sandboxes   map[string]*sandbox
	containers  map[string]*container
	seq         int               // objects created so far
	nSandboxes  int               // sandboxes created so far, for pod IPs
	names       map[string]string // reserved sandbox and container names, to their ID
	exitOnStart map[string]int32  // container name: the exit code its process ends with at once
	images      map[string]*runtimeapi.Image

	nextIDs []string // IDs the next created objects take, set by NextIDs

	hooksMu  sync.Mutex
	hooks    map[string]Hook
	programs map[string]Program // ExecSync's, by name
	rewrites map[string]func(proto.Message)
	failures map[string][]error
	calls    map[string]int
	requests map[string][]proto.Message
	streams  map[chan error]struct{} // open GetContainerEvents streams, to end with EndEventStreams
}

// Hook runs before the runtime serves method; a non-nil error is the call's
// answer. req is the decoded request.
type Hook func(ctx context.Context, method string, req any) error

// Option configures a Runtime.
type Option func(*options)

type options struct {
	clock      func() time.Time
	podIP      func(n int) string
	server     func(*Runtime) runtimeapi.RuntimeServiceServer
	serverOpts []grpc.ServerOption
	images     []string // held from the start; nil: NodeImages
}

// WithClock makes the runtime stamp times from clock instead of time.Now.
func WithClock(clock func() time.Time) Option { return func(o *options) { o.clock = clock } }

// WithPodIP gives the nth sandbox on a pod network (from 1) the address
// podIP(n); by default it is 192.0.2.x (TEST-NET-1), never the host's.
func WithPodIP(podIP func(n int) string) Option { return func(o *options) { o.podIP = podIP } }

// WithRuntimeService serves wrap(rt) in place of rt as the runtime service:
// a test type that embeds *Runtime and overrides one method.
func WithRuntimeService(wrap func(*Runtime) runtimeapi.RuntimeServiceServer) Option {
	return func(o *options) { o.server = wrap }
}

// WithServerOptions adds gRPC server options (an UnknownServiceHandler,
// message size limits) to the server Start and Serve build.
func WithServerOptions(opts ...grpc.ServerOption) Option {
	return func(o *options) { o.serverOpts = append(o.serverOpts, opts...) }
}

// New returns a Runtime that is not served yet; see Start and Serve.
func New(opts ...Option) *Runtime {
	r := &Runtime{
		sandboxes: map[string]*sandbox{}, containers: map[string]*container{}, names: map[string]string{},
		exitOnStart: map[string]int32{}, images: map[string]*runtimeapi.Image{},
		hooks: map[string]Hook{}, programs: map[string]Program{}, rewrites: map[string]func(proto.Message){}, failures: map[string][]error{}, calls: map[string]int{},
		requests: map[string][]proto.Message{}, streams: map[chan error]struct{}{},
	}
	r.opts.clock = time.Now
	r.opts.podIP = func(n int) string { return "192.0.2." + strconv.Itoa(1+n%250) }
	for _, o := range opts {
		o(&r.opts)
	}
	held := NodeImages
	if r.opts.images != nil {
		held = r.opts.images
	}
	for _, name := range held {
		r.addImageLocked(name)
	}
	r.events = newEventQueue()
	return r
}

// Start serves a new Runtime on a unix socket in t.TempDir(), dials it, and
// stops both when the test ends.
func Start(t testing.TB, opts ...Option) *Runtime {
	t.Helper()
	r := New(opts...)
	r.ServeAt(t, filepath.Join(t.TempDir(), "runtime.sock"))
	return r
}

// ServeAt serves r on sock, sets r.Sock and r.Conn, and stops both when the
// test ends.
func (r *Runtime) ServeAt(t testing.TB, sock string) {
	t.Helper()
	stop, err := r.Serve(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// Serve serves r on the unix socket sock until stop is called, for callers
// without a testing.TB; it sets r.Sock and r.Conn.
func (r *Runtime) Serve(sock string) (stop func(), err error) {
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		lis.Close()
		return nil, err
	}
	sopts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(r.unaryHook), grpc.ChainStreamInterceptor(r.streamHook),
		grpc.MaxRecvMsgSize(64 << 20), grpc.MaxSendMsgSize(64 << 20)}, r.opts.serverOpts...)
	gs := grpc.NewServer(sopts...)
	var svc runtimeapi.RuntimeServiceServer = r
	if r.opts.server != nil {
		svc = r.opts.server(r)
	}
	runtimeapi.RegisterRuntimeServiceServer(gs, svc)
	runtimeapi.RegisterImageServiceServer(gs, r)
	go func() { _ = gs.Serve(lis) }()
	r.Sock, r.Conn, r.gs = sock, cc, gs
	return func() { cc.Close(); gs.Stop(); r.events.shutdown() }, nil
}

// Client is a runtime service client of r.Conn.
func (r *Runtime) Client() runtimeapi.RuntimeServiceClient {
	return runtimeapi.NewRuntimeServiceClient(r.Conn)
}

// ImageClient is an image service client of r.Conn.
func (r *Runtime) ImageClient() runtimeapi.ImageServiceClient {
	return runtimeapi.NewImageServiceClient(r.Conn)
}

// Stop stops serving at once, closing every connection, as a runtime
// that crashes; the state stays for a later Serve.
func (r *Runtime) Stop() {
	if r.gs != nil {
		r.gs.Stop()
	}
}

// OnCall makes h run before every call of method ("StartContainer"); nil
// removes it.
func (r *Runtime) OnCall(method string, h Hook) {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	if h == nil {
		delete(r.hooks, method)
		return
	}
	r.hooks[method] = h
}

// Rewrite makes fn change every answer of method before it leaves (every
// message of a stream), for tests of answers containerd gives in states the
// fake does not model (a pod whose IP is not known yet, fields a newer
// cri-api adds); nil removes it. fn gets a copy.
func (r *Runtime) Rewrite(method string, fn func(resp proto.Message)) {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	if fn == nil {
		delete(r.rewrites, method)
		return
	}
	r.rewrites[method] = fn
}

// NextIDs makes the next sandboxes and containers created take these IDs,
// in order, instead of random ones, for tests that name them.
func (r *Runtime) NextIDs(ids ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextIDs = append(r.nextIDs, ids...)
}

// FailNext makes the next n calls of method fail with err without effect.
func (r *Runtime) FailNext(method string, n int, err error) {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	for range n {
		r.failures[method] = append(r.failures[method], err)
	}
}

// Calls is how many calls of method the server received, failed ones included.
func (r *Runtime) Calls(method string) int {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	return r.calls[method]
}

// Requests are copies of the requests of method the server received, in order.
func (r *Runtime) Requests(method string) []proto.Message {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	return append([]proto.Message(nil), r.requests[method]...)
}

// before counts and records a call and runs its hook and injected failure.
func (r *Runtime) before(ctx context.Context, fullMethod string, req any) error {
	method := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	r.hooksMu.Lock()
	r.calls[method]++
	if m, ok := req.(proto.Message); ok {
		r.requests[method] = append(r.requests[method], proto.Clone(m))
	}
	h := r.hooks[method]
	var fail error
	if q := r.failures[method]; len(q) > 0 {
		fail, r.failures[method] = q[0], q[1:]
	}
	r.hooksMu.Unlock()
	if h != nil {
		if err := h(ctx, method, req); err != nil {
			return err
		}
	}
	return fail
}

func (r *Runtime) unaryHook(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := r.before(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	resp, err := handler(ctx, req)
	r.hooksMu.Lock()
	fn := r.rewrites[info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]]
	r.hooksMu.Unlock()
	if m, ok := resp.(proto.Message); ok && err == nil && fn != nil {
		m = proto.Clone(m)
		fn(m)
		resp = m
	}
	return resp, err
}

// streamHook runs before for server streams (their request is not decoded
// yet at this point, so hooks see nil) and the method's Rewrite on every
// message the stream sends.
func (r *Runtime) streamHook(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := r.before(ss.Context(), info.FullMethod, nil); err != nil {
		return err
	}
	r.hooksMu.Lock()
	fn := r.rewrites[info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]]
	r.hooksMu.Unlock()
	if fn != nil {
		ss = rewritingStream{ss, fn}
	}
	return handler(srv, ss)
}

// rewritingStream applies a Rewrite to a copy of every message sent.
type rewritingStream struct {
	grpc.ServerStream
	fn func(proto.Message)
}

func (s rewritingStream) SendMsg(m any) error {
	if pm, ok := m.(proto.Message); ok {
		pm = proto.Clone(pm)
		s.fn(pm)
		m = pm
	}
	return s.ServerStream.SendMsg(m)
}

func (r *Runtime) now() int64 { return r.opts.clock().UnixNano() }

// newIDLocked is the next ID NextIDs gave, or a new one as containerd
// makes them: 64 random hex digits.
func (r *Runtime) newIDLocked() string {
	if len(r.nextIDs) > 0 {
		id := r.nextIDs[0]
		r.nextIDs = r.nextIDs[1:]
		return id
	}
	return randomID()
}

// randomID is an ID as containerd makes them: 64 random hex digits.
func randomID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lookup resolves an ID or a unique prefix of one, as containerd's
// truncindex does; it returns "" when none or several match.
func lookup[T any](m map[string]T, id string) string {
	if id == "" {
		return ""
	}
	if _, ok := m[id]; ok {
		return id
	}
	found := ""
	for k := range m {
		if strings.HasPrefix(k, id) {
			if found != "" {
				return ""
			}
			found = k
		}
	}
	return found
}
