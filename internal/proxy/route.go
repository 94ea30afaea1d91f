package proxy

import (
	"bytes"
	"context"

	"google.golang.org/grpc"
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
// encoded response. The response is only valid until the hook returns
// (its memory goes back to gRPC's buffer pool then): a hook that keeps it
// for later keeps a copy. Returned as it is, it is sent without a copy.
// The last answer next returned is the one sent when the hook returns
// it.
type BytesNext func(ctx context.Context, req []byte) ([]byte, error)

// unaryBytesIf is the route of a bytes hook: a feature that reads a unary call's encoded
// messages (with protowire) and decodes them only when it has something to
// change: fn gets the request as the kubelet encoded it and returns the
// response to send, which may be the runtime's own bytes (then sent on as
// the buffers they arrived in, as a bare forwarder would). While active()
// reports false the call is forwarded raw. In a chain it must be the last
// link (New refuses it elsewhere): its forward goes to the runtime.
//
// It is a frames hook (frames.go) whose next joins the frames of an answer
// that arrived in more than one; one that arrived in one is not copied.
func unaryBytesIf(method string, active func() bool, fn func(ctx context.Context, req []byte, next BytesNext) ([]byte, error)) hookRoute {
	return unaryFramesIf(method, active, func(ctx context.Context, req []byte, next FramesNext) ([]byte, bool, error) {
		var got []byte
		resp, err := fn(ctx, req, func(ctx context.Context, req []byte) ([]byte, error) {
			frames, err := next(ctx, req)
			if err != nil {
				return nil, err
			}
			if len(frames) == 1 {
				got = frames[0]
			} else {
				got = bytes.Join(frames, nil)
			}
			return got, nil
		})
		switch {
		case err != nil:
			return nil, false, err
		case got != nil && len(resp) == len(got) && (len(got) == 0 || &resp[0] == &got[0]):
			return nil, true, nil
		case within(resp, got):
			// A part of the runtime's buffers, which go back to gRPC's
			// pool when the call ends, before what is sent is written.
			return bytes.Clone(resp), false, nil
		}
		return resp, false, nil
	})
}

// within reports whether r is a part of b, as any slice of b is when b's
// capacity is its length (the frames a hook gets are capped so): its
// capacity ends where b ends.
func within(r, b []byte) bool {
	if cap(r) == 0 || len(b) == 0 {
		return false
	}
	return &r[:cap(r)][cap(r)-1] == &b[len(b)-1]
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
