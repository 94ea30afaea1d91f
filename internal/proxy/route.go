package proxy

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// UnaryNext forwards a (possibly changed) request to the next feature hooked
// on the method or, from the last, to the runtime.
type UnaryNext[Req, Resp any] func(ctx context.Context, req *Req) (*Resp, error)

// unary builds the route of a unary hook: the request is decoded, fn decides
// what to do with it and may call next to forward it.
func unary[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](method string, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) hookRoute {
	nextOf := func(backend grpc.ClientConnInterface) UnaryNext[Req, Resp] {
		return func(ctx context.Context, r *Req) (*Resp, error) {
			resp := PResp(new(Resp))
			if err := backend.Invoke(outgoingContext(ctx), method, PReq(r), resp); err != nil {
				return nil, err
			}
			return (*Resp)(resp), nil
		}
	}
	return hookRoute{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
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

// unaryIf is unary whose typed path runs only while active() reports true;
// otherwise the call is forwarded raw, so a feature with nothing to do costs
// the hot path one function call.
func unaryIf[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](method string, active func() bool, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) hookRoute {
	typed := unary[Req, Resp, PReq, PResp](method, fn)
	return hookRoute{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
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

// observeUnary is a route that forwards a unary call raw, exactly as a method
// without a route, after showing observe the encoded request (no decode, and
// no copy when it arrived in one buffer) while active() reports true: for a
// feature that only needs to know that a call was made, and about what.
func observeUnary(method string, active func() bool, observe func(req []byte)) hookRoute {
	return hookRoute{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		if !active() {
			return forwardUnaryObserved(ss, method, backend, nil)
		}
		return forwardUnaryObserved(ss, method, backend, observe)
	}}
}

// BytesNext forwards an encoded request to the runtime and returns the
// encoded response.
type BytesNext func(ctx context.Context, req []byte) ([]byte, error)

// unaryBytesIf is the route of a bytes hook: a feature that reads a unary call's encoded
// messages (with protowire) and decodes them only when it has something to
// change: fn gets the request as the kubelet encoded it and returns the
// response to send, which may be the runtime's own bytes. While active()
// reports false the call is forwarded raw. In a chain it must be the last
// route (New refuses it elsewhere): its forward goes to the runtime.
func unaryBytesIf(method string, active func() bool, fn func(ctx context.Context, req []byte, next BytesNext) ([]byte, error)) hookRoute {
	nextOf := func(backend grpc.ClientConnInterface, ss grpc.ServerStream) BytesNext {
		return func(ctx context.Context, req []byte) ([]byte, error) {
			in := frame{data: mem.BufferSlice{mem.SliceBuffer(req)}}
			var out frame
			if err := invokeFrames(ctx, ss, method, backend, &in, &out); err != nil {
				return nil, err
			}
			b := out.data.Materialize()
			out.free()
			return b, nil
		}
	}
	return hookRoute{Method: method, bytesRoute: true, active: active,
		Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
			if !active() {
				return forwardUnary(ss, method, backend)
			}
			var in frame
			if err := ss.RecvMsg(&in); err != nil {
				return err
			}
			req := in.data.Materialize()
			in.free()
			resp, err := fn(ctx, req, nextOf(backend, ss))
			if err != nil {
				return err
			}
			return ss.SendMsg(&frame{data: mem.BufferSlice{mem.SliceBuffer(resp)}})
		},
		Invoke: func(ctx context.Context, backend grpc.ClientConnInterface, req, resp any) error {
			if !active() {
				return backend.Invoke(ctx, method, req, resp)
			}
			b, err := proto.Marshal(req.(proto.Message))
			if err != nil {
				return err
			}
			out, err := fn(ctx, b, nextOf(backend, nil))
			if err != nil {
				return err
			}
			return proto.Unmarshal(out, resp.(proto.Message))
		}}
}

// unaryHook binds a unary hook: always decoded when active is nil, else
// decoded only while active reports true.
func unaryHook[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method, active func() bool, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) hookRoute {
	if active == nil {
		return unary[Req, Resp, PReq, PResp](m.FullName(), fn)
	}
	return unaryIf[Req, Resp, PReq, PResp](m.FullName(), active, fn)
}
