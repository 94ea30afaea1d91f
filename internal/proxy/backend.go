package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// BackendOptions tune the connection to the runtime.
type BackendOptions struct {
	MaxRecvMsgSize int
	MaxSendMsgSize int
	// ReconnectMaxDelay caps gRPC's reconnect backoff, so the shim serves again
	// within about this long after the runtime comes back.
	ReconnectMaxDelay time.Duration
}

// SocketPath accepts "unix:///path" or "/path" and returns the path.
func SocketPath(endpoint string) (string, error) {
	p := strings.TrimPrefix(endpoint, "unix://")
	if p == "" || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("endpoint %q: want an absolute unix socket path or unix:///path", endpoint)
	}
	return p, nil
}

// DialBackend opens a lazily connected, self-reconnecting client connection to
// the runtime's CRI socket. It does not wait for the runtime: while the runtime
// is down, calls fail fast with Unavailable and the connection keeps retrying.
func DialBackend(endpoint string, o BackendOptions) (*grpc.ClientConn, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	bc := backoff.DefaultConfig
	bc.BaseDelay = 50 * time.Millisecond
	if o.ReconnectMaxDelay > 0 {
		bc.MaxDelay = o.ReconnectMaxDelay
	}
	opts := append(DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 2 * time.Second}),
		// An idle timeout would add a reconnect to the first call after a quiet spell.
		grpc.WithIdleTimeout(0),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(o.MaxRecvMsgSize),
			grpc.MaxCallSendMsgSize(o.MaxSendMsgSize),
		),
		grpc.WithSharedWriteBuffer(true),
	)
	// "passthrough" keeps the target opaque: the dialer above knows the path.
	return grpc.NewClient("passthrough:///cri-runtime", opts...)
}
