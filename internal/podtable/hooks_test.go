package podtable

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The sandbox is announced gone when the runtime removed it or no longer
// knows it, and not when the removal failed.
func TestRemovePodSandboxAnnouncesGone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		runtime error
		gone    bool
	}{
		{"removed", nil, true},
		{"runtime NotFound", status.Error(codes.NotFound, "no sandbox"), true},
		{"feature NotFound", fmt.Errorf("sandbox: %w", errdefs.ErrNotFound), true},
		{"failed", status.Error(codes.Unavailable, "containerd down"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, b := table(t, &lister{})
			if err := b.Put(sb, []byte("x")); err != nil {
				t.Fatal(err)
			}
			told := false
			tb.st.Subscribe(func(id string) { told = id == sb })
			_, err := tb.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb},
				func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
					if tc.runtime != nil {
						return nil, tc.runtime
					}
					return &runtimeapi.RemovePodSandboxResponse{}, nil
				})
			if !errors.Is(err, tc.runtime) {
				t.Fatalf("err %v, want the runtime's %v", err, tc.runtime)
			}
			_, gerr := b.Get(sb)
			if told != tc.gone || (gerr == nil) == tc.gone {
				t.Fatalf("told %v, record left %v; want gone %v", told, gerr == nil, tc.gone)
			}
		})
	}
}
