package proxy

import (
	"errors"

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
