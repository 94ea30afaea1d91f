package restore

import (
	"errors"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/proxy"
)

// The service's errors are plain Go errors of a class the proxy maps to a
// gRPC code once, at its edge (proxy.Status): an errdefs kind, a context
// error, or the runtime's own gRPC status, passed on. The caller (the
// kubelet, crictl) is shown the error's message.

// The helpers of proxy's error classification, under the names the
// service's files use.
var (
	errorf  = proxy.Errorf
	message = proxy.Message
	code    = proxy.Code
)

// isNotFound reports whether a runtime call's error says the object is gone.
func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound || errors.Is(err, os.ErrNotExist)
}
