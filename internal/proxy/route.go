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
	return Route{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		req := PReq(new(Req))
		if err := ss.RecvMsg(req); err != nil {
			return err
		}
		next := func(ctx context.Context, r *Req) (*Resp, error) {
			resp := PResp(new(Resp))
			if err := backend.Invoke(outgoingContext(ctx), method, PReq(r), resp); err != nil {
				return nil, err
			}
			return (*Resp)(resp), nil
		}
		resp, err := fn(ctx, (*Req)(req), next)
		if err != nil {
			return err
		}
		return ss.SendMsg(PResp(resp))
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
	typed := Unary[Req, Resp, PReq, PResp](method, fn).Handler
	return Route{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		if !active() {
			return forwardUnary(ss, method, backend)
		}
		return typed(ctx, ss, backend)
	}}
}

// ForwardServerStream relays a server-streaming call raw, for a route that
// has nothing to change in this call.
func ForwardServerStream(ss grpc.ServerStream, method string, backend grpc.ClientConnInterface) error {
	return forwardServerStream(ss, method, backend)
}
