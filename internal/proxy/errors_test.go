package proxy

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

func TestStatusMapsEveryErrorKindToItsCode(t *testing.T) {
	runtimeErr := status.Error(codes.NotFound, "container \"c1\" not found")
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"runtime status", runtimeErr, codes.NotFound, "container \"c1\" not found"},
		{"wrapped runtime status", fmt.Errorf("RestorePod: %w", runtimeErr), codes.NotFound, "RestorePod: " + runtimeErr.Error()},
		{"canceled", fmt.Errorf("waiting: %w", context.Canceled), codes.Canceled, "waiting: context canceled"},
		{"deadline", fmt.Errorf("waiting: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "waiting: context deadline exceeded"},
		{"not durable", fmt.Errorf("recording: %w: /x: %w", statefile.ErrNotDurable, errors.New("disk full")), codes.Unavailable,
			"recording: state could not be made durable: /x: disk full"},
		{"not found", fmt.Errorf("checkpoint %q: %w", "cp", errdefs.ErrNotFound), codes.NotFound, "checkpoint \"cp\": not found"},
		{"invalid, own message", errdefs.ErrInvalidArgument.WithMessage("pod_sandbox_id is empty"), codes.InvalidArgument, "pod_sandbox_id is empty"},
		{"precondition", fmt.Errorf("sandbox: %w", errdefs.ErrFailedPrecondition), codes.FailedPrecondition, "sandbox: failed precondition"},
		{"unavailable", errdefs.ErrUnavailable.WithMessage("try later"), codes.Unavailable, "try later"},
		{"already exists", fmt.Errorf("x: %w", errdefs.ErrAlreadyExists), codes.AlreadyExists, "x: already exists"},
		{"resource exhausted", fmt.Errorf("x: %w", errdefs.ErrResourceExhausted), codes.ResourceExhausted, "x: resource exhausted"},
		{"internal", fmt.Errorf("x: %w", errdefs.ErrInternal), codes.Internal, "x: internal"},
		{"plain", errors.New("something broke"), codes.Unknown, "something broke"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Status(tc.err)
			st, ok := status.FromError(got)
			if !ok {
				t.Fatalf("Status(%v) = %v, not a gRPC status", tc.err, got)
			}
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("Status(%v) = %s %q, want %s %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	if Status(nil) != nil {
		t.Error("Status(nil) is not nil")
	}
	if got := Status(runtimeErr); got != runtimeErr {
		t.Errorf("Status of the runtime's own status error = %v, want it unchanged", got)
	}
}
