package podstate

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// statusFails is a runtime whose ContainerStatus does not answer.
type statusFails struct{ *fakeRT }

func (statusFails) ContainerStatus(context.Context, *runtimeapi.ContainerStatusRequest, ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error) {
	return nil, status.Error(codes.DeadlineExceeded, "runtime too slow")
}

// A listed exit whose status cannot be read cannot be classified: the list
// is not answered rather than show it as it is (the kubelet would publish a
// container that is about to restart as terminated).
func TestListWithAnUnclassifiableExitIsNotAnswered(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.exit(ids["main"], 88)
	k.m.rt = statusFails{k.rt}
	if err := k.tryList(); err == nil {
		t.Fatal("list with an unreadable exit answered")
	}
	if ph, _ := k.m.phaseOf(sb); ph != PhaseRunning {
		t.Fatalf("phase %s without a classification", ph)
	}
	k.m.rt = k.rt
	if got := k.list(); got[ids["main"]] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("list once the status reads: %v, want main shown running", got)
	}
	if ph, _ := k.m.phaseOf(sb); ph != PhaseTerminating {
		t.Fatalf("phase %s, want the restart begun", ph)
	}
}
