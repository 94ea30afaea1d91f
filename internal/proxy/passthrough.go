package proxy

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

var (
	serverStreamDesc = &grpc.StreamDesc{ServerStreams: true}
	bidiStreamDesc   = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
)

// outgoingContext carries the caller's deadline, cancellation and application
// metadata (trace context, for one) to the runtime. Transport headers are left
// for gRPC to set; when the caller sent nothing else, no metadata is copied.
func outgoingContext(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	var out metadata.MD
	for k, v := range md {
		if transportHeader(k) {
			continue
		}
		if out == nil {
			out = make(metadata.MD, len(md))
		}
		out[k] = v
	}
	if out == nil {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, out)
}

func transportHeader(k string) bool {
	switch k {
	case "content-type", "user-agent", "te":
		return true
	}
	return strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-")
}

// forwardUnary relays a unary call with no goroutine and no decode.
func forwardUnary(ss grpc.ServerStream, method string, backend grpc.ClientConnInterface) error {
	return forwardUnaryObserved(ss, method, backend, nil)
}

// forwardUnaryObserved is forwardUnary that first shows the encoded request
// to observe, when set.
func forwardUnaryObserved(ss grpc.ServerStream, method string, backend grpc.ClientConnInterface, observe func(req []byte)) error {
	var in, out frame
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	if observe != nil {
		if len(in.data) == 1 {
			observe(in.data[0].ReadOnlyData())
		} else {
			observe(in.data.Materialize())
		}
	}
	if err := invokeFrames(ss.Context(), ss, method, backend, &in, &out); err != nil {
		// The runtime's status (code, message, details) is returned as is.
		return err
	}
	return ss.SendMsg(&out)
}

// invokeFrames makes a unary call with encoded messages and hands the
// runtime's header and trailer metadata on to the caller's stream (ss may be
// nil). On error, out holds nothing.
func invokeFrames(ctx context.Context, ss grpc.ServerStream, method string, backend grpc.ClientConnInterface, in, out *frame) error {
	var header, trailer metadata.MD
	err := backend.Invoke(outgoingContext(ctx), method, in, out, grpc.Header(&header), grpc.Trailer(&trailer))
	in.free() // only set if the call failed before sending
	if ss != nil {
		if len(header) > 0 {
			_ = ss.SetHeader(header)
		}
		if len(trailer) > 0 {
			ss.SetTrailer(trailer)
		}
	}
	if err != nil {
		out.free()
	}
	return err
}

// forwardServerStream relays one request and then every response until the
// runtime ends the stream or the caller goes away. Either side's end cancels
// the other: the caller's context is the parent of the runtime call's.
func forwardServerStream(ss grpc.ServerStream, method string, backend grpc.ClientConnInterface) error {
	var in frame
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(outgoingContext(ss.Context()))
	defer cancel()
	cs, err := backend.NewStream(ctx, serverStreamDesc, method)
	if err != nil {
		in.free()
		return err
	}
	if err := cs.SendMsg(&in); err != nil {
		in.free()
		return recvStatus(cs, err)
	}
	if err := cs.CloseSend(); err != nil {
		return recvStatus(cs, err)
	}
	return pumpResponses(ss, cs)
}

// forwardBidi relays a call of a method this build does not know, whatever its
// arity: requests flow in a goroutine that ends when the caller half-closes or
// the call ends; responses flow in the caller's goroutine.
func forwardBidi(ss grpc.ServerStream, method string, backend grpc.ClientConnInterface) error {
	ctx, cancel := context.WithCancel(outgoingContext(ss.Context()))
	defer cancel()
	cs, err := backend.NewStream(ctx, bidiStreamDesc, method)
	if err != nil {
		return err
	}
	upstreamDone := make(chan error, 1)
	go func() {
		for {
			var f frame
			if err := ss.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					upstreamDone <- cs.CloseSend()
					return
				}
				// The caller is gone or sent garbage: end the runtime call too.
				upstreamDone <- err
				cancel()
				return
			}
			if err := cs.SendMsg(&f); err != nil {
				f.free()
				// io.EOF here means the runtime ended the call; its status comes from RecvMsg.
				upstreamDone <- nil
				return
			}
		}
	}()
	err = pumpResponses(ss, cs)
	// The request pump may still be blocked reading from a caller that has not
	// half-closed; gRPC cancels the server stream when this handler returns, which
	// ends that read, so the goroutine cannot outlive the call. Waiting here
	// instead would deadlock on such a caller.
	if err == nil {
		select {
		case uerr := <-upstreamDone:
			if uerr != nil && !errors.Is(uerr, io.EOF) {
				err = uerr
			}
		default:
		}
	}
	return err
}

// pumpResponses copies the runtime's responses to the caller and returns the
// runtime's final status. Headers go out before the first response.
func pumpResponses(ss grpc.ServerStream, cs grpc.ClientStream) error {
	headerSent := false
	for {
		var f frame
		err := cs.RecvMsg(&f)
		if !headerSent {
			headerSent = true
			if md, herr := cs.Header(); herr == nil && len(md) > 0 {
				if err := ss.SendHeader(md); err != nil {
					f.free()
					return err
				}
			}
		}
		if err != nil {
			if tr := cs.Trailer(); len(tr) > 0 {
				ss.SetTrailer(tr)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(&f); err != nil {
			f.free()
			// The caller went away; returning cancels the runtime call.
			return err
		}
	}
}

// recvStatus turns a send-side io.EOF into the status the runtime ended the call with.
func recvStatus(cs grpc.ClientStream, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	var f frame
	for {
		rerr := cs.RecvMsg(&f)
		f.free()
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return nil
			}
			return rerr
		}
	}
}
