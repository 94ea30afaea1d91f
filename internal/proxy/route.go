package proxy

import (
	"bytes"
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
// encoded response. The response is only valid until the hook returns
// (its memory goes back to gRPC's buffer pool then): a hook that keeps it
// for later keeps a copy. Returned as it is, it is sent without a copy.
type BytesNext func(ctx context.Context, req []byte) ([]byte, error)

// bytesCall is one call of a bytes hook: the runtime's answers it got from
// next, which it may send on as they are.
type bytesCall struct {
	method  string
	backend grpc.ClientConnInterface
	ss      grpc.ServerStream // nil in a chain
	got     []mem.Buffer
}

// next is the hook's BytesNext. An answer that arrived in several buffers
// (one per HTTP/2 data frame) is made contiguous in a pooled buffer
// (answerPool), as grpc-go's own proto codec does with what it decodes
// (encoding/proto/proto.go: MaterializeToBuffer).
func (c *bytesCall) next(ctx context.Context, req []byte) ([]byte, error) {
	in := frame{data: mem.BufferSlice{mem.SliceBuffer(req)}}
	var out frame
	if err := invokeFrames(ctx, c.ss, c.method, c.backend, &in, &out); err != nil {
		return nil, err
	}
	buf := out.data.MaterializeToBuffer(answers)
	out.free()
	c.got = append(c.got, buf)
	b := buf.ReadOnlyData()
	// Capped: a hook that appends to the answer gets memory of its own.
	return b[:len(b):len(b)], nil
}

// take returns the answer whose bytes resp is, and gives up its hold on
// it; nil when resp is not one of them. A part of an answer (a hook should
// not return one) is copied, since the answers go back to the pool when
// the call ends, before gRPC has written what is sent.
func (c *bytesCall) take(resp []byte) (buf mem.Buffer, out []byte) {
	for i, buf := range c.got {
		b := buf.ReadOnlyData()
		if len(b) == len(resp) && (len(b) == 0 || &b[0] == &resp[0]) {
			c.got = append(c.got[:i], c.got[i+1:]...)
			return buf, resp
		}
		if within(resp, b) {
			return nil, bytes.Clone(resp)
		}
	}
	return nil, resp
}

// within reports whether r is a part of b, as any slice of b is when b's
// capacity is its length (next hands out answers so): its capacity ends
// where b ends.
func within(r, b []byte) bool {
	if cap(r) == 0 || len(b) == 0 {
		return false
	}
	return &r[:cap(r)][cap(r)-1] == &b[len(b)-1]
}

// release returns the answers to the pool.
func (c *bytesCall) release() {
	for _, buf := range c.got {
		buf.Free()
	}
	c.got = nil
}

// unaryBytesIf is the route of a bytes hook: a feature that reads a unary call's encoded
// messages (with protowire) and decodes them only when it has something to
// change: fn gets the request as the kubelet encoded it and returns the
// response to send, which may be the runtime's own bytes (then sent on
// without a copy, as a bare forwarder would). While active() reports
// false the call is forwarded raw. In a chain it must be the last link
// (New refuses it elsewhere): its forward goes to the runtime.
func unaryBytesIf(method string, active func() bool, fn func(ctx context.Context, req []byte, next BytesNext) ([]byte, error)) hookRoute {
	l := &link{active: active, bytes: true}
	l.serve = func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		var in frame
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		req := in.data.Materialize()
		in.free()
		call := &bytesCall{method: method, backend: backend, ss: ss}
		defer call.release()
		resp, err := fn(ctx, req, call.next)
		if err != nil {
			return err
		}
		buf, resp := call.take(resp)
		if buf == nil {
			buf = mem.SliceBuffer(resp)
		}
		// gRPC frees buf once written (codec.go).
		return ss.SendMsg(&frame{data: mem.BufferSlice{buf}})
	}
	// In a chain (after a typed link, which decoded the request): the
	// request is encoded again, and the answer decoded into newResp, the
	// method's response type (set by New from the typed links).
	l.call = func(ctx context.Context, backend grpc.ClientConnInterface, req proto.Message, _ chainNext) (proto.Message, error) {
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, err
		}
		call := &bytesCall{method: method, backend: backend}
		defer call.release()
		out, err := fn(ctx, b, call.next)
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
