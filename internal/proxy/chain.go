package proxy

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Features hooked on one unary method form a chain: a plain list of links
// in feature order, each called with a next that runs the next active link
// or, from the last, the runtime. A link that is not active is skipped;
// with no link active the call is forwarded raw, and with one it serves the
// call alone, on its own fast path (a bytes hook reads the encoded
// messages).

// link is one feature's hook on a unary method.
type link struct {
	// active says whether the feature has anything to do now; nil: always.
	active func() bool
	// serve handles the call alone: receives the request, runs the hook
	// with the runtime as its next, sends the answer.
	serve Handler
	// call runs the hook on a decoded request inside a chain.
	call func(ctx context.Context, backend grpc.ClientConnInterface, req proto.Message, next chainNext) (proto.Message, error)
	// newReq and newResp make the method's messages (nil for a bytes
	// link until New sets newResp from the chain's typed links).
	newReq, newResp func() proto.Message
	// bytes: a bytes hook, whose forward goes to the runtime: it can only
	// be the last link.
	bytes bool
}

// chainNext forwards a decoded request to the rest of a chain.
type chainNext func(ctx context.Context, req proto.Message) (proto.Message, error)

func (l *link) isActive() bool { return l.active == nil || l.active() }

// handler serves the method when l is the only hook on it: raw while it is
// not active.
func (l *link) handler(method string) Handler {
	if l.active == nil {
		return l.serve
	}
	return func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		if !l.active() {
			return forwardUnary(ss, method, backend)
		}
		return l.serve(ctx, ss, backend)
	}
}

// serveChain serves a call of a method with two hooks or more.
func (rt *route) serveChain(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
	var only *link
	n := 0
	for _, l := range rt.links {
		if l.isActive() {
			only, n = l, n+1
		}
	}
	switch n {
	case 0:
		return forwardUnary(ss, rt.method, backend)
	case 1:
		return only.serve(ctx, ss, backend)
	}
	req := rt.newReq()
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	resp, err := rt.callFrom(0, ctx, backend, req)
	if err != nil {
		return err
	}
	return ss.SendMsg(resp)
}

// callFrom runs the first active link from i on, whose next runs the one
// after it; past the last, the runtime.
func (rt *route) callFrom(i int, ctx context.Context, backend grpc.ClientConnInterface, req proto.Message) (proto.Message, error) {
	for ; i < len(rt.links); i++ {
		l := rt.links[i]
		if !l.isActive() {
			continue
		}
		return l.call(ctx, backend, req, func(ctx context.Context, req proto.Message) (proto.Message, error) {
			resp, err := rt.callFrom(i+1, ctx, backend, req)
			// The next feature's error reaches this one as the runtime's
			// would: as a gRPC status.
			return resp, Status(err)
		})
	}
	resp := rt.newResp()
	return resp, backend.Invoke(outgoingContext(ctx), rt.method, req, resp)
}
