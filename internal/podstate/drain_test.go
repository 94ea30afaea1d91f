package podstate

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// The shim stopping (an in-place upgrade, a restart) while a restart's
// StartContainer is in the runtime: the call finishes, it is not cancelled
// (containerd would be left mid-start and refuse the next process's start),
// and Run returns once it has.
func TestRunEndsAfterTheRuntimeCallInProgress(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	// Every StartContainer is held in the runtime until gate is closed (or
	// its call ends, as a gRPC call's would).
	gate, held := make(chan struct{}), make(chan string, 8)
	k.rt.OnCall("StartContainer", func(ctx context.Context, _ string, req any) error {
		held <- req.(*runtimeapi.StartContainerRequest).ContainerId
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	})
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.m.Run(ctx); close(done) }()
	var id string
	select {
	case id = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the restart never reached a StartContainer")
	}
	cancel()
	select {
	case <-done:
		t.Fatal("Run ended while its StartContainer was still in the runtime")
	case <-time.After(200 * time.Millisecond):
	}
	close(gate)
	select {
	case <-done:
	case <-time.After(drainTimeout):
		t.Fatal("Run did not end after the call in progress finished")
	}
	if s := k.container(id); s.StartedAt == 0 {
		t.Fatalf("the start of %s was cut short: %v", id, s)
	}
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseStartup {
		t.Fatalf("phase %s after the stop, want Startup (resumed by the next process)", p.Phase)
	}
}
