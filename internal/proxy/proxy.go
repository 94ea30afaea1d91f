// Package proxy routes CRI calls between the kubelet and the runtime.
//
// Every call lands in one handler registered as gRPC's unknown-service handler.
// A call whose method has a typed Route (a feature of the shim that changes the
// call) is decoded and handed to that route; every other call, including
// methods this build's cri-api does not know, is forwarded as raw bytes. The
// proxy therefore forwards exactly what the kubelet sent and returns exactly
// what the runtime answered, status codes and details included.
package proxy

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/metrics"
)

// kind says how a method's messages flow, as declared by the CRI service descriptors.
type kind uint8

const (
	kindUnknown      kind = iota // not in this build's cri-api: any arity, full-duplex pump
	kindUnary                    // one request, one response
	kindServerStream             // one request, a stream of responses
)

// Handler serves one call a feature takes part in.
// backend is the connection to the runtime, for calls the handler still forwards.
type Handler func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error

// hookRoute is one feature's hook bound to its full method name
// ("/runtime.v1.RuntimeService/X").
type hookRoute struct {
	Method  string
	Handler Handler
	// Invoke, set by unary and unaryIf, runs the same route on decoded
	// messages. It lets several features take part in one unary method: the
	// first serves the call, and its forward to the runtime runs the next
	// one's Invoke instead (see New).
	Invoke func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error
	// decoded, when set, is Handler without its raw fast path: the first route
	// of a chain must always hand decoded messages to the next.
	decoded Handler
	// active, set by unaryIf and unaryBytesIf, says whether the route has
	// anything to do now.
	active func() bool
	// bytesRoute: built by unaryBytesIf; its Invoke forwards frames, so it
	// can only be the last route of a chain.
	bytesRoute bool
	// stream: a server-streaming hook, which cannot be chained.
	stream bool
}

type member struct {
	active  func() bool // nil: always active
	handler Handler
}

type route struct {
	kind    kind
	handler Handler // nil: raw pass-through
	invoke  func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error
	chain   []func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error // routes after the first
	decoded Handler
	// members are the chained routes in order; when every one has an active
	// func and none is active, the call is forwarded raw, and when exactly
	// one is, it serves the call alone (the others would only pass it on).
	members []member
	last    bool // the last route added was built by unaryBytesIf
	metrics *metrics.Method
}

// Proxy is the CRI router. Its tables are built in New and only read afterwards,
// so concurrent calls share no lock.
type Proxy struct {
	backend *grpc.ClientConn
	routes  map[string]*route
	unknown route
	metrics *metrics.Collector
}

// CRIMethods lists the full names of every method of the CRI runtime and image
// services known to this build, unary and streaming.
func CRIMethods() []string {
	var out []string
	for _, sd := range []*grpc.ServiceDesc{&runtimeapi.RuntimeService_ServiceDesc, &runtimeapi.ImageService_ServiceDesc} {
		for _, m := range sd.Methods {
			out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, s := range sd.Streams {
			out = append(out, "/"+sd.ServiceName+"/"+s.StreamName)
		}
	}
	return out
}

// New builds a proxy forwarding to backend, with the hooks of features bound
// in the order given: on a method several features hook, the first serves
// the call and each one's next goes to the one after it, the last one's to
// the runtime. Hooks that cannot be chained (two stream hooks on one method,
// a hook after a bytes hook) are refused, because one would silently shadow
// the other.
func New(backend *grpc.ClientConn, mc *metrics.Collector, features ...any) (*Proxy, error) {
	routes, err := routesOf(features)
	if err != nil {
		return nil, err
	}
	return newWithRoutes(backend, mc, routes)
}

// newWithRoutes builds the proxy from bound hooks.
func newWithRoutes(backend *grpc.ClientConn, mc *metrics.Collector, routes []hookRoute) (*Proxy, error) {
	p := &Proxy{
		backend: backend,
		routes:  make(map[string]*route),
		metrics: mc,
		unknown: route{kind: kindUnknown, metrics: mc.For(metrics.OtherMethod)},
	}
	for _, sd := range []*grpc.ServiceDesc{&runtimeapi.RuntimeService_ServiceDesc, &runtimeapi.ImageService_ServiceDesc} {
		for _, m := range sd.Methods {
			fm := "/" + sd.ServiceName + "/" + m.MethodName
			p.routes[fm] = &route{kind: kindUnary, metrics: mc.For(fm)}
		}
		for _, s := range sd.Streams {
			fm := "/" + sd.ServiceName + "/" + s.StreamName
			k := kindServerStream
			if s.ClientStreams {
				k = kindUnknown
			}
			p.routes[fm] = &route{kind: k, metrics: mc.For(fm)}
		}
	}
	for _, r := range routes {
		rt, ok := p.routes[r.Method]
		if !ok {
			return nil, fmt.Errorf("proxy: hook on %q: not a CRI method of this build", r.Method)
		}
		if r.Handler == nil {
			return nil, fmt.Errorf("proxy: hook on %q has no handler", r.Method)
		}
		if rt.handler == nil {
			rt.handler, rt.invoke, rt.decoded = r.Handler, r.Invoke, r.decoded
			rt.members = append(rt.members, member{active: r.active, handler: r.Handler})
			rt.last = r.bytesRoute
			continue
		}
		if rt.invoke == nil || r.Invoke == nil {
			return nil, fmt.Errorf("proxy: two hooks on %q and one of them cannot be chained (a stream hook or an observer)", r.Method)
		}
		if rt.last {
			return nil, fmt.Errorf("proxy: a hook on %q after a bytes hook, which must come last", r.Method)
		}
		if rt.chain == nil && rt.decoded != nil {
			rt.handler = rt.decoded
		}
		rt.chain = append(rt.chain, r.Invoke)
		rt.members = append(rt.members, member{active: r.active, handler: r.Handler})
		rt.last = r.bytesRoute
	}
	return p, nil
}

// ServerOptions are the options a grpc.Server needs to serve this proxy: the raw
// catch-all handler and the codec that lets frames through undecoded.
func (p *Proxy) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.UnknownServiceHandler(p.handle),
		grpc.ForceServerCodecV2(newCodec()),
		// Reused stream goroutines keep their grown stacks: without workers every
		// call starts a fresh goroutine and pays for growing its stack again.
		// When all workers are busy (long-lived event streams) gRPC still starts
		// a new goroutine, so a stream can never starve the pool.
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
		// Fixed flow-control windows turn off gRPC's bandwidth-delay probing,
		// which on a unix socket only costs: with it, every request frame the
		// kubelet sends is answered by a window update and a PING, whose ACK
		// wakes the reader once more, all to size a window for a link with
		// no delay. The fixed sizes are where the probing ends up anyway
		// (its limit is 16 MiB).
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	}
}

// Flow-control windows of both the kubelet-facing server and the runtime
// connection (see ServerOptions).
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// DialOptions are the options the runtime connection needs so that frames pass
// through the client side undecoded too, with fixed flow-control windows (see
// ServerOptions).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newCodec())),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
	}
}

func (p *Proxy) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "cri-shim: no method on stream")
	}
	rt := p.routes[method]
	if rt == nil {
		rt = &p.unknown
	}
	start := time.Now()
	var err error
	switch {
	case rt.chain != nil:
		switch only, n := rt.activeMembers(); n {
		case 0:
			err = forwardUnary(ss, method, p.backend)
		case 1:
			err = Status(only(ss.Context(), ss, p.backend))
		default:
			err = Status(rt.handler(ss.Context(), ss, &chainConn{method: method, invokes: rt.chain, backend: p.backend}))
		}
	case rt.handler != nil:
		err = Status(rt.handler(ss.Context(), ss, p.backend))
	case rt.kind == kindUnary:
		err = forwardUnary(ss, method, p.backend)
	default:
		rt.metrics.StreamOpened()
		if rt.kind == kindServerStream {
			err = forwardServerStream(ss, method, p.backend)
		} else {
			err = forwardBidi(ss, method, p.backend)
		}
		rt.metrics.StreamClosed()
	}
	rt.metrics.Done(start, err)
	return err
}

// chainConn is the backend a chained route sees: its forward of the chained
// method runs the next route, any other call goes to the runtime.
type chainConn struct {
	method  string
	invokes []func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error
	backend grpc.ClientConnInterface
}

func (c *chainConn) Invoke(ctx context.Context, method string, req, resp any, opts ...grpc.CallOption) error {
	if method != c.method || len(c.invokes) == 0 {
		return c.backend.Invoke(ctx, method, req, resp, opts...)
	}
	var next grpc.ClientConnInterface = c.backend
	if len(c.invokes) > 1 {
		next = &chainConn{method: c.method, invokes: c.invokes[1:], backend: c.backend}
	}
	// The next feature's error reaches this one as the runtime's would: as
	// a gRPC status.
	return Status(c.invokes[0](ctx, next, req, resp))
}

func (c *chainConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.backend.NewStream(ctx, desc, method, opts...)
}

// activeMembers counts the chained routes with work to do now and returns
// the handler of the last one counted.
func (r *route) activeMembers() (Handler, int) {
	var h Handler
	n := 0
	for _, m := range r.members {
		if m.active == nil || m.active() {
			h = m.handler
			n++
		}
	}
	return h, n
}
