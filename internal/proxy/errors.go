package proxy

import (
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// Status maps an error a feature returns to the gRPC status the kubelet
// sees; it is the one place where errors become codes. The message is always
// err.Error().
//
//   - nil stays nil.
//   - An error that is or wraps a gRPC status (the runtime's answer, passed
//     through) is returned unchanged: gRPC sends its code, and err.Error() as
//     the message when it is wrapped.
//   - statefile.ErrNotDurable becomes Unavailable: a record the shim could not
//     make durable is retried by the kubelet.
//   - Otherwise errgrpc.ToGRPC decides: an errdefs kind (errdefs.ErrNotFound,
//     ErrInvalidArgument, ErrFailedPrecondition, ErrUnavailable, ...) becomes
//     its code, context.Canceled and context.DeadlineExceeded become Canceled
//     and DeadlineExceeded, anything else Unknown.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, statefile.ErrNotDurable) {
		return status.Error(codes.Unavailable, err.Error())
	}
	return errgrpc.ToGRPC(err)
}

// NotFound reports whether err, from the runtime or a feature after the
// caller, is NotFound once it reaches the kubelet (Status): a removal the
// kubelet takes as already done.
func NotFound(err error) bool { return status.Code(Status(err)) == codes.NotFound }

// classified is an error that reads exactly msg and is of kind's class.
type classified struct {
	msg  string
	kind error
}

func (e *classified) Error() string { return e.msg }
func (e *classified) Unwrap() error { return e.kind }

// Errorf returns an error that reads exactly the formatted message and is
// of kind's class for Status: an errdefs sentinel (errdefs.ErrInvalidArgument,
// ...), context.DeadlineExceeded, or an error from the runtime, whose gRPC
// code it keeps. Features build the errors they answer the kubelet with here.
func Errorf(kind error, format string, a ...any) error {
	return &classified{msg: fmt.Sprintf(format, a...), kind: kind}
}

// Message is err's text as the caller is shown it: a gRPC status's message
// without gRPC's "rpc error: code = ... desc = " frame.
func Message(err error) string { return status.Convert(err).Message() }

// RuntimeKind is the class of a runtime call's error: its gRPC code, passed
// on, or Internal for an error without one.
func RuntimeKind(err error) error {
	if c := status.Code(err); c == codes.OK || c == codes.Unknown {
		return errdefs.ErrInternal
	}
	return err
}

// Code is the gRPC code the caller is answered err with (metric labels).
func Code(err error) codes.Code { return status.Code(Status(err)) }
