package podstate

import (
	"context"
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// During a restart the encoded paths show the kubelet exactly what the
// decoded ones do.
func TestBytesPathsMatchDecodedPaths(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	compare := func(when string) {
		t.Helper()
		// Decoded: the runtime's list and statuses, and the engine's
		// decisions applied to them.
		want := decodedList(t, k)
		if got := k.list(); !maps.Equal(got, want) {
			t.Fatalf("%s: encoded list %v, decoded %v", when, got, want)
		}
		for id := range want {
			ts, err := k.cri.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
			if err != nil {
				t.Fatal(err)
			}
			if err := k.m.FixStatus(ts.Status); err != nil {
				t.Fatal(err)
			}
			if bs := k.status(id); !proto.Equal(bs, ts.Status) {
				t.Fatalf("%s: encoded status of %s %v, decoded %v", when, id, bs, ts.Status)
			}
		}
	}
	compare("running")
	k.exit(ids["main"], 88)
	compare("trigger exited")
	if k.m.pods.Get(sb).Phase != restartrecord.PhaseTerminating {
		t.Fatalf("phase %s", k.m.pods.Get(sb).Phase)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	compare("after the restart")
}
