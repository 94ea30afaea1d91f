package restartview

// ContainerStatus and GetContainerEvents through the engine's view.

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// ContainerStatusBytes serves ContainerStatus on the encoded response: only
// a status the engine may change (an exit, or an instance shown running) is
// decoded; a running container's passes through as the runtime sent it, and
// a kept answer for an exited instance is sent again (exited.go).
func (v *View) ContainerStatusBytes(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	id, plain, perr := wire.PeekStatusRequest(req)
	plain = plain && perr == nil
	if plain {
		if b := v.cachedExited(id); b != nil {
			return b, nil
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if c, ok, err := wire.PeekStatus(resp); err == nil && (!ok || !v.e.StatusMayChange(c)) {
		if plain && ok && c.ID == id {
			v.keepExited(c, resp)
		}
		return resp, nil
	}
	var r runtimeapi.ContainerStatusResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, fmt.Errorf("cri-shim: runtime's ContainerStatusResponse: %w: %w", errdefs.ErrInternal, err)
	}
	if err := v.e.FixStatus(r.GetStatus()); err != nil {
		return nil, err
	}
	return proto.Marshal(&r)
}

// GetContainerEvents relays the runtime's container events to the kubelet
// without the ones the engine keeps from it (Engine.DropEvent).
func (v *View) GetContainerEvents(ctx context.Context, req *runtimeapi.GetEventsRequest,
	send func(*runtimeapi.ContainerEventResponse) error,
	next proxy.StreamNext[runtimeapi.GetEventsRequest, runtimeapi.ContainerEventResponse]) error {
	cs, err := next(ctx, req)
	if err != nil {
		return err
	}
	return proxy.Relay(cs, send, func(e *runtimeapi.ContainerEventResponse) (bool, error) {
		return v.e.Tracked() == 0 || !v.e.DropEvent(e), nil
	})
}
