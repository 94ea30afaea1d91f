package criu

import (
	"errors"
	"fmt"
	"os"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// The service's errors are plain Go errors of a class the proxy maps to a
// gRPC code once, at its edge (proxy.Status): an errdefs kind, a context
// error, or the runtime's own gRPC status, passed on. The caller (the
// kubelet, crictl) is shown the error's message.

// classified is an error that reads exactly msg and is of kind's class.
type classified struct {
	msg  string
	kind error
}

func (e *classified) Error() string { return e.msg }
func (e *classified) Unwrap() error { return e.kind }

// errorf returns an error that reads exactly the formatted message and is of
// kind's class: an errdefs sentinel (errdefs.ErrInvalidArgument, ...),
// context.DeadlineExceeded, or an error from the runtime, whose gRPC code it
// keeps.
func errorf(kind error, format string, a ...any) error {
	return &classified{msg: fmt.Sprintf(format, a...), kind: kind}
}

// message is err's text as the caller is shown it: a gRPC status's message
// without gRPC's "rpc error: code = ... desc = " frame.
func message(err error) string {
	return status.Convert(err).Message()
}

// runtimeKind is the class of a runtime call's error: its gRPC code, passed
// on, or Internal for an error without one.
func runtimeKind(err error) error {
	if c := status.Code(err); c == codes.OK || c == codes.Unknown {
		return errdefs.ErrInternal
	}
	return err
}

// code is the gRPC code the caller is answered err with (metric labels).
func code(err error) codes.Code {
	return status.Code(proxy.Status(err))
}

// isNotFound reports whether a runtime call's error says the object is gone.
func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound || errors.Is(err, os.ErrNotExist)
}
