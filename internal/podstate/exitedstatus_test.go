package podstate

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// rawStatus makes a ContainerStatus call through the bytes route and returns
// the encoded answer and how many calls reached the runtime.
func (k kubelet) rawStatus(id string, verbose bool) ([]byte, int, error) {
	k.t.Helper()
	req, err := proto.Marshal(&runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
	if err != nil {
		k.t.Fatal(err)
	}
	before := k.rt.Calls("ContainerStatus")
	out, err := k.view().ContainerStatusBytes(context.Background(), req, func(ctx context.Context, b []byte) ([]byte, error) {
		var r runtimeapi.ContainerStatusRequest
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		resp, err := k.cri.ContainerStatus(ctx, &r)
		if err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	})
	return out, k.rt.Calls("ContainerStatus") - before, err
}

// runtimeAnswer is what the runtime itself answers for id, encoded.
func (k kubelet) runtimeAnswer(id string) []byte {
	k.t.Helper()
	resp, err := k.cri.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		k.t.Fatal(err)
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		k.t.Fatal(err)
	}
	return b
}

// crashedOnce runs crashingMainPod through one restart and returns the
// exited previous instance (shown as exited, settled).
func crashedOnce(t *testing.T, sub *uint64) (kubelet, string, string) {
	k, sb, p := crashingMainPod(t)
	k.m.opts.EventsLive = func() uint64 { return *sub }
	prev := p.Latest["main"]
	k.exit(prev, 1)
	k.status(prev)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if p.Latest["main"] == prev || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("test setup: no restart (latest %s, phase %s)", p.Latest["main"], p.Phase)
	}
	return k, sb, prev
}

// The runtime's answer for an exited instance of a governed container is sent
// again, byte for byte, without a round trip, while nothing can have changed.
func TestExitedStatusAnsweredAgain(t *testing.T) {
	sub := uint64(1)
	k, sb, prev := crashedOnce(t, &sub)
	var want, got runtimeapi.ContainerStatusResponse
	if err := proto.Unmarshal(k.runtimeAnswer(prev), &want); err != nil {
		t.Fatal(err)
	}
	first, calls, err := k.rawStatus(prev, false)
	if err != nil || calls != 1 {
		t.Fatalf("first call: %d runtime calls, err %v", calls, err)
	}
	if err := proto.Unmarshal(first, &got); err != nil || !proto.Equal(&got, &want) || got.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("first call: %v, want the runtime's exited status %v", &got, &want)
	}
	// Again: the runtime's first answer, byte for byte.
	for i := range 3 {
		again, calls, err := k.rawStatus(prev, false)
		if err != nil || calls != 0 || !bytes.Equal(again, first) {
			t.Fatalf("call %d: %d runtime calls, err %v, same bytes %v", i+2, calls, err, bytes.Equal(again, first))
		}
	}
	// Verbose: always the runtime's (its info is recomputed).
	if _, calls, _ := k.rawStatus(prev, true); calls != 1 {
		t.Fatalf("verbose call: %d runtime calls, want 1", calls)
	}
	// The running instance is never kept.
	cur := k.m.pods.Get(sb).Latest["main"]
	for range 2 {
		if _, calls, _ := k.rawStatus(cur, false); calls != 1 {
			t.Fatalf("running instance: %d runtime calls, want 1", calls)
		}
	}
}

// Anything that could make a kept answer stale sends the call to the runtime.
func TestExitedStatusDropped(t *testing.T) {
	t.Run("no event feed", func(t *testing.T) {
		sub := uint64(0)
		k, _, prev := crashedOnce(t, &sub)
		for range 2 {
			if _, calls, _ := k.rawStatus(prev, false); calls != 1 {
				t.Fatalf("%d runtime calls, want 1", calls)
			}
		}
	})
	t.Run("feed resubscribed", func(t *testing.T) {
		sub := uint64(1)
		k, _, prev := crashedOnce(t, &sub)
		k.rawStatus(prev, false)
		sub = 2 // events in between may be lost
		if _, calls, _ := k.rawStatus(prev, false); calls != 1 {
			t.Fatalf("%d runtime calls after a new subscription, want 1", calls)
		}
		if _, calls, _ := k.rawStatus(prev, false); calls != 0 {
			t.Fatalf("%d runtime calls once kept again, want 0", calls)
		}
	})
	for _, c := range []struct {
		name   string
		remove func(k kubelet, sb, id string)
	}{
		{"removed behind the shim", func(k kubelet, sb, id string) {
			_, _ = k.cri.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id})
			k.event(sb, id, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
		}},
		{"removed by the kubelet", func(k kubelet, _, id string) { k.remove(id) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			sub := uint64(1)
			k, sb, prev := crashedOnce(t, &sub)
			k.rawStatus(prev, false)
			c.remove(k, sb, prev)
			if _, calls, err := k.rawStatus(prev, false); calls != 1 || status.Code(err) != codes.NotFound {
				t.Fatalf("%d runtime calls, err %v; want 1 and NotFound", calls, err)
			}
		})
	}
	t.Run("gone from the runtime's list", func(t *testing.T) {
		sub := uint64(1)
		k, _, prev := crashedOnce(t, &sub)
		k.rawStatus(prev, false)
		_, _ = k.cri.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: prev})
		k.m.reconcile(context.Background()) // forgets the instance
		if _, calls, err := k.rawStatus(prev, false); calls != 1 || status.Code(err) != codes.NotFound {
			t.Fatalf("%d runtime calls, err %v; want 1 and NotFound", calls, err)
		}
	})
	t.Run("untracked pod", func(t *testing.T) {
		sub := uint64(1)
		k := newKubelet(t, t.TempDir())
		k.m.opts.EventsLive = func() uint64 { return sub }
		sb := k.runPod(nil)
		id := k.start(sb, "main")
		k.exit(id, 1)
		for range 2 {
			if _, calls, _ := k.rawStatus(id, false); calls != 1 {
				t.Fatalf("untracked container: %d runtime calls, want 1", calls)
			}
		}
	})
}
