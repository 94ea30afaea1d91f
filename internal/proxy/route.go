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

// unaryIf is unary whose typed path runs only while active() reports true
// (nil: always); otherwise the call is forwarded raw, so a feature with
// nothing to do costs the hot path one function call.
func unaryIf[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](method string, active func() bool, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) hookRoute {
	l := &link{
		active:  active,
		newReq:  func() proto.Message { return PReq(new(Req)) },
		newResp: func() proto.Message { return PResp(new(Resp)) },
		call: func(ctx context.Context, _ grpc.ClientConnInterface, req proto.Message, next chainNext) (proto.Message, error) {
			resp, err := fn(ctx, req.(PReq), func(ctx context.Context, r *Req) (*Resp, error) {
				out, err := next(ctx, PReq(r))
				if err != nil {
					return nil, err
				}
				return out.(PResp), nil
			})
			if err != nil {
				return nil, err
			}
			return PResp(resp), nil
		},
	}
	l.serve = func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		req := l.newReq()
		if err := ss.RecvMsg(req); err != nil {
			return err
		}
		resp, err := l.call(ctx, backend, req, func(ctx context.Context, r proto.Message) (proto.Message, error) {
			out := l.newResp()
			return out, backend.Invoke(outgoingContext(ctx), method, r, out)
		})
		if err != nil {
			return err
		}
		return ss.SendMsg(resp)
	}
	return hookRoute{Method: method, link: l, Handler: l.handler(method)}
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
// link (New refuses it elsewhere): its forward goes to the runtime.
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
	l := &link{active: active, bytes: true}
	l.serve = func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
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
	}
	// In a chain (after a typed link, which decoded the request): the
	// request is encoded again, and the answer decoded into newResp, the
	// method's response type (set by New from the typed links).
	l.call = func(ctx context.Context, backend grpc.ClientConnInterface, req proto.Message, _ chainNext) (proto.Message, error) {
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, err
		}
		out, err := fn(ctx, b, nextOf(backend, nil))
		if err != nil {
			return nil, err
		}
		resp := l.newResp()
		return resp, proto.Unmarshal(out, resp)
	}
	return hookRoute{Method: method, link: l, Handler: l.handler(method)}
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
	return unaryIf[Req, Resp, PReq, PResp](m.FullName(), active, fn)
}
