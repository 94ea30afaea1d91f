package proxy

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// FramesNext forwards an encoded request to the runtime and returns the
// encoded answer in the buffers it arrived in (one per HTTP/2 data frame,
// up to 16 KiB each), without joining them: they are only valid until the
// hook returns.
type FramesNext func(ctx context.Context, req []byte) ([][]byte, error)

// framesCall is one call of a frames hook: the runtime's answers it got.
type framesCall struct {
	method  string
	backend grpc.ClientConnInterface
	ss      grpc.ServerStream // nil in a chain
	got     []mem.BufferSlice
}

func (c *framesCall) next(ctx context.Context, req []byte) ([][]byte, error) {
	in := frame{data: mem.BufferSlice{mem.SliceBuffer(req)}}
	var out frame
	if err := invokeFrames(ctx, c.ss, c.method, c.backend, &in, &out); err != nil {
		return nil, err
	}
	c.got = append(c.got, out.data)
	segs := make([][]byte, len(out.data))
	for i, b := range out.data {
		d := b.ReadOnlyData()
		segs[i] = d[:len(d):len(d)]
	}
	return segs, nil
}

// last gives up the hold on the last answer and returns it.
func (c *framesCall) last() mem.BufferSlice {
	if len(c.got) == 0 {
		return mem.BufferSlice{}
	}
	out := c.got[len(c.got)-1]
	c.got = c.got[:len(c.got)-1]
	return out
}

func (c *framesCall) release() {
	for _, d := range c.got {
		d.Free()
	}
	c.got = nil
}

// unaryFramesIf is the route of a frames hook: a bytes hook (unaryBytesIf)
// that reads the runtime's answer in the buffers it arrived in, and says
// whether to send it on as it is (asIs: exactly as a bare forwarder would,
// the same buffers) or to send resp instead, memory of its own. A hook
// that calls next more than once sends the last answer when asIs.
func unaryFramesIf(method string, active func() bool, fn func(ctx context.Context, req []byte, next FramesNext) (resp []byte, asIs bool, err error)) hookRoute {
	l := &link{active: active, bytes: true}
	l.serve = func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		var in frame
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		req := in.data.Materialize()
		in.free()
		call := &framesCall{method: method, backend: backend, ss: ss}
		defer call.release()
		resp, asIs, err := fn(ctx, req, call.next)
		if err != nil {
			return err
		}
		if asIs {
			// gRPC frees the buffers once written (codec.go).
			return ss.SendMsg(&frame{data: call.last()})
		}
		return ss.SendMsg(&frame{data: mem.BufferSlice{mem.SliceBuffer(resp)}})
	}
	// In a chain, after a typed link: as unaryBytesIf.
	l.call = func(ctx context.Context, backend grpc.ClientConnInterface, req proto.Message, _ chainNext) (proto.Message, error) {
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, err
		}
		call := &framesCall{method: method, backend: backend}
		defer call.release()
		out, asIs, err := fn(ctx, b, call.next)
		if err != nil {
			return nil, err
		}
		if asIs {
			last := call.last()
			out = last.Materialize()
			last.Free()
		}
		resp := l.newResp()
		return resp, proto.Unmarshal(out, resp)
	}
	return hookRoute{Method: method, link: l, Handler: l.handler(method)}
}
