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
	"google.golang.org/protobuf/proto"
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
	Method string
	// Handler serves the call when the hook is the only one on its method.
	Handler Handler
	// link, for a unary hook, is how it takes part in a chain (chain.go);
	// nil: the hook cannot share its method (a stream hook, an observer).
	link *link
}

type route struct {
	kind    kind
	method  string
	handler Handler // one hook: its handler; nil: raw pass-through
	first   *link   // the one hook's link, kept in case a second comes
	// links are the hooks of a method with two or more, in feature order
	// (chain.go); newReq and newResp make its messages.
	links           []*link
	newReq, newResp func() proto.Message
	metrics         *metrics.Method
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
			p.routes[fm] = &route{kind: kindUnary, method: fm, metrics: mc.For(fm)}
		}
		for _, s := range sd.Streams {
			fm := "/" + sd.ServiceName + "/" + s.StreamName
			k := kindServerStream
			if s.ClientStreams {
				k = kindUnknown
			}
			p.routes[fm] = &route{kind: k, method: fm, metrics: mc.For(fm)}
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
		if err := rt.add(r); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// add binds one more hook to the method's route, in feature order.
func (rt *route) add(r hookRoute) error {
	if rt.handler == nil && rt.links == nil {
		rt.handler, rt.first = r.Handler, r.link
		return nil
	}
	if r.link == nil || (rt.links == nil && rt.first == nil) {
		return fmt.Errorf("proxy: two hooks on %q and one of them cannot be chained (a stream hook or an observer)", r.Method)
	}
	if rt.links == nil {
		rt.links, rt.handler = []*link{rt.first}, nil
		rt.newReq, rt.newResp = rt.first.newReq, rt.first.newResp
	}
	if rt.links[len(rt.links)-1].bytes {
		return fmt.Errorf("proxy: a hook on %q after a bytes hook, which must come last", r.Method)
	}
	if r.link.newReq != nil {
		rt.newReq, rt.newResp = r.link.newReq, r.link.newResp
	}
	if r.link.bytes {
		// Last, after the typed links that give the method's messages.
		r.link.newResp = rt.newResp
	}
	rt.links = append(rt.links, r.link)
	return nil
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
	case rt.links != nil:
		err = Status(rt.serveChain(ss.Context(), ss, p.backend))
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
