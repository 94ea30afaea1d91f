package restartview

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// engine is an Engine that governs the containers in tracked and changes
// no status.
type engine struct{ tracked map[string]bool }

func (e *engine) Tracked() int { return len(e.tracked) }
func (e *engine) Interest(restarting []string) (_, _ *wire.HeadSet, _ []string) {
	var heads []uint64
	for id := range e.tracked {
		heads = append(heads, wire.IDHead([]byte(id)))
	}
	return wire.NewHeadSet(heads), nil, restarting
}
func (e *engine) Verdicts(_ context.Context, cs []wire.Container, _ *runtimeapi.ContainerStateValue) ([]wire.Verdict, error) {
	return make([]wire.Verdict, len(cs)), nil
}
func (e *engine) StatusMayChange(wire.Container) bool               { return false }
func (e *engine) FixStatus(*runtimeapi.ContainerStatus) error       { return nil }
func (e *engine) DropEvent(*runtimeapi.ContainerEventResponse) bool { return false }
func (e *engine) Unchanged(c wire.Container) bool                   { return e.tracked[c.ID] }

// exitedRuntime answers ContainerStatus of an exited container and counts
// the calls.
type exitedRuntime struct{ calls int }

func (r *exitedRuntime) status(_ context.Context, req []byte) ([]byte, error) {
	r.calls++
	var q runtimeapi.ContainerStatusRequest
	if err := proto.Unmarshal(req, &q); err != nil {
		return nil, err
	}
	return proto.Marshal(&runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: q.ContainerId,
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"}, State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 1}})
}

func statusOf(t *testing.T, v *View, rt *exitedRuntime, id string) []byte {
	t.Helper()
	req, _ := proto.Marshal(&runtimeapi.ContainerStatusRequest{ContainerId: id})
	out, err := v.ContainerStatusBytes(context.Background(), req, rt.status)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The runtime's answer for an exited governed container is sent again
// without a round trip, until the kubelet removes the container, the
// runtime reports it deleted, the engine stops governing it, or the event
// subscription changes.
func TestKeptAnswerAndWhatDropsIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop func(v *View, e *engine, sub *uint64)
	}{
		{"RemoveContainer", func(v *View, _ *engine, _ *uint64) {
			_, _ = v.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: "c1"},
				func(context.Context, *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
					return &runtimeapi.RemoveContainerResponse{}, nil
				})
		}},
		{"deleted event", func(v *View, _ *engine, _ *uint64) {
			v.OnEvent(&events.Event{ContainerID: "c1", Type: runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT})
		}},
		{"no longer governed, swept", func(v *View, e *engine, _ *uint64) {
			delete(e.tracked, "c1")
			v.prune()
		}},
		{"new subscription, swept", func(v *View, _ *engine, sub *uint64) {
			*sub = 2
			v.prune()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &engine{tracked: map[string]bool{"c1": true}}
			sub := uint64(1)
			v := New(e, func() uint64 { return sub }, slog.New(slog.NewTextHandler(io.Discard, nil)))
			rt := &exitedRuntime{}
			first := statusOf(t, v, rt, "c1")
			if again := statusOf(t, v, rt, "c1"); rt.calls != 1 || !bytes.Equal(again, first) {
				t.Fatalf("%d runtime calls for two statuses (same answer %v), want 1", rt.calls, bytes.Equal(again, first))
			}
			tc.drop(v, e, &sub)
			if _, kept := v.exited.Load("c1"); kept {
				t.Fatal("the answer is still kept")
			}
			statusOf(t, v, rt, "c1")
			if rt.calls != 2 {
				t.Fatalf("%d runtime calls after the drop, want 2", rt.calls)
			}
		})
	}
}
