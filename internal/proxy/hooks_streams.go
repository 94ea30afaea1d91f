package proxy

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Stream hooks: one feature per method. The hook gets the kubelet's request,
// send (a response to the kubelet) and next (opens the call on the runtime),
// and relays what it wants of the runtime's stream.

// Relay sends the kubelet every response of the runtime's stream cs that
// edit keeps (edit may change it; an error ends the call), until the runtime
// ends the stream: io.EOF is a clean end (nil), any other error the
// runtime's status.
func Relay[Resp any](cs grpc.ServerStreamingClient[Resp], send func(*Resp) error, edit func(*Resp) (keep bool, err error)) error {
	for {
		r, err := cs.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		keep, err := edit(r)
		if err != nil {
			return err
		}
		if !keep {
			continue
		}
		if err := send(r); err != nil {
			return err
		}
	}
}

// StreamNext opens a server-streaming call on the runtime.
type StreamNext[Req, Resp any] func(ctx context.Context, req *Req) (grpc.ServerStreamingClient[Resp], error)

// StreamContainersHook takes part in StreamContainers: send relays a batch
// to the kubelet, next opens the runtime's stream.
type StreamContainersHook interface {
	StreamContainers(ctx context.Context, req *runtimeapi.StreamContainersRequest,
		send func(*runtimeapi.StreamContainersResponse) error,
		next StreamNext[runtimeapi.StreamContainersRequest, runtimeapi.StreamContainersResponse]) error
}

// GetContainerEventsHook is always called, whatever the feature's Activity
// says: the stream lives as long as the kubelet, longer than any state the
// check was made in.
type GetContainerEventsHook interface {
	GetContainerEvents(ctx context.Context, req *runtimeapi.GetEventsRequest,
		send func(*runtimeapi.ContainerEventResponse) error,
		next StreamNext[runtimeapi.GetEventsRequest, runtimeapi.ContainerEventResponse]) error
}

func streamHooks() []binder {
	return []binder{
		bindStream(StreamContainers, StreamContainersHook.StreamContainers, false),
		bindStream(GetContainerEvents, GetContainerEventsHook.GetContainerEvents, true),
	}
}

// bindStream binds a stream hook; with always set, the feature's Activity
// is not asked.
func bindStream[H, Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method, call func(H, context.Context, *Req, func(*Resp) error, StreamNext[Req, Resp]) error, always bool) binder {
	return binder{m, func(f any, active func() bool) (hookRoute, bool) {
		h, ok := f.(H)
		if !ok {
			return hookRoute{}, false
		}
		if always {
			active = nil
		}
		return streamHook[Req, Resp, PReq, PResp](m, active, func(ctx context.Context, req *Req, send func(*Resp) error, next StreamNext[Req, Resp]) error {
			return call(h, ctx, req, send, next)
		}), true
	}}
}

// streamHook builds the route of a server-streaming hook; while active
// reports false the call is relayed raw.
func streamHook[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method, active func() bool, fn func(ctx context.Context, req *Req, send func(*Resp) error, next StreamNext[Req, Resp]) error) hookRoute {
	method := m.FullName()
	return hookRoute{Method: method, Handler: func(ctx context.Context, ss grpc.ServerStream, backend grpc.ClientConnInterface) error {
		if active != nil && !active() {
			return forwardServerStream(ss, method, backend)
		}
		req := PReq(new(Req))
		if err := ss.RecvMsg(req); err != nil {
			return err
		}
		next := func(ctx context.Context, r *Req) (grpc.ServerStreamingClient[Resp], error) {
			cs, err := backend.NewStream(outgoingContext(ctx), serverStreamDesc, method)
			if err != nil {
				return nil, err
			}
			if err := cs.SendMsg(PReq(r)); err != nil {
				return nil, err
			}
			if err := cs.CloseSend(); err != nil {
				return nil, err
			}
			return &grpc.GenericClientStream[Req, Resp]{ClientStream: cs}, nil
		}
		send := func(r *Resp) error { return ss.SendMsg(PResp(r)) }
		return fn(ctx, (*Req)(req), send, next)
	}}
}
