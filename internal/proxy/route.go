package proxy

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// UnaryNext forwards a (possibly changed) request to the runtime.
type UnaryNext[Req, Resp any] func(ctx context.Context, req *Req) (*Resp, error)

// Unary builds a typed Route for a unary CRI method: the request is decoded, fn
// decides what to do with it and may call next to forward it to the runtime.
// Only methods a feature really changes should be routed this way; the rest stay
// raw and pay no decode.
func Unary[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](method string, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) Route {
	nextOf := func(backend grpc.ClientConnInterface) UnaryNext[Req, Resp] {
		return func(ctx context.Context, r *Req) (*Resp, error) {
			resp := PResp(new(Resp))
			if err := backend.Invoke(outgoingContext(ctx), method, PReq(r), resp); err != nil {
				return nil, err
			}
			return (*Resp)(resp), nil
		}
	}
	return Route{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		req := PReq(new(Req))
		if err := ss.RecvMsg(req); err != nil {
			return err
		}
		resp, err := fn(ctx, (*Req)(req), nextOf(backend))
		if err != nil {
			return err
		}
		return ss.SendMsg(PResp(resp))
	}, Invoke: func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error {
		r, err := fn(ctx, req.(*Req), nextOf(backend))
		if err != nil {
			return err
		}
		out := resp.(PResp)
		proto.Reset(out)
		proto.Merge(out, PResp(r))
		return nil
	}}
}

// UnaryIf is Unary whose typed path runs only while active() reports true;
// otherwise the call is forwarded raw, so a feature with nothing to do costs
// the hot path one function call.
func UnaryIf[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](method string, active func() bool, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) Route {
	typed := Unary[Req, Resp, PReq, PResp](method, fn)
	return Route{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		if !active() {
			return forwardUnary(ss, method, backend)
		}
		return typed.Handler(ctx, ss, backend)
	}, active: active, decoded: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		if active() {
			return typed.Handler(ctx, ss, backend)
		}
		req, resp := PReq(new(Req)), PResp(new(Resp))
		if err := ss.RecvMsg(req); err != nil {
			return err
		}
		if err := backend.Invoke(outgoingContext(ctx), method, req, resp); err != nil {
			return err
		}
		return ss.SendMsg(resp)
	}, Invoke: func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error {
		if !active() {
			return backend.Invoke(ctx, method, req, resp)
		}
		return typed.Invoke(ctx, backend, req, resp)
	}}
}

// ForwardServerStream relays a server-streaming call raw, for a route that
// has nothing to change in this call.
func ForwardServerStream(ss grpc.ServerStream, method string, backend grpc.ClientConnInterface) error {
	return forwardServerStream(ss, method, backend)
}

// ObserveUnary is a Route that forwards a unary call raw, exactly as a method
// without a route, after telling observe the size of the encoded request (no
// decode, no copy): for a feature that only needs to know that a call was made
// and, by its size, roughly with which filter.
func ObserveUnary(method string, observe func(reqLen int)) Route {
	return Route{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		return forwardUnaryObserved(ss, method, backend, observe)
	}}
}
