package restore

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// An error reads exactly its message and reaches the caller with its class's
// code: an errdefs kind's, a context error's, or the runtime's own code.
func TestErrorfKeepsMessageAndClass(t *testing.T) {
	runtimeErr := status.Error(codes.ResourceExhausted, "no space for the sandbox")
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"errdefs kind", proxy.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not ready", "sb1", "NOTREADY"),
			codes.FailedPrecondition, "sandbox sb1 is NOTREADY, not ready"},
		{"deadline", proxy.Errorf(context.DeadlineExceeded, "%s", "deadline reached"), codes.DeadlineExceeded, "deadline reached"},
		{"runtime code kept", proxy.Errorf(runtimeErr, "RestorePod: creating the sandbox: %s", proxy.Message(runtimeErr)),
			codes.ResourceExhausted, "RestorePod: creating the sandbox: no space for the sandbox"},
		{"runtime error without a code", proxy.Errorf(proxy.RuntimeKind(status.Error(codes.Unknown, "criu failed")), "capturing: %s", "criu failed"),
			codes.Internal, "capturing: criu failed"},
		{"runtime code through runtimeKind", proxy.Errorf(proxy.RuntimeKind(runtimeErr), "capturing: %s", proxy.Message(runtimeErr)),
			codes.ResourceExhausted, "capturing: no space for the sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err.Error() != tc.msg {
				t.Errorf("message %q, want %q", tc.err.Error(), tc.msg)
			}
			st := status.Convert(proxy.Status(tc.err))
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("the caller sees %s %q, want %s %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
			if proxy.Code(tc.err) != tc.code {
				t.Errorf("metric label %s, want %s", proxy.Code(tc.err), tc.code)
			}
		})
	}
	if !errors.Is(proxy.Errorf(errdefs.ErrNotFound, "gone"), errdefs.ErrNotFound) {
		t.Error("errorf's error is not of its kind for errors.Is")
	}
}
