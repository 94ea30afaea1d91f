package podstate

// ListContainers and StreamContainers through the restart view: hidden and
// faked instances, on the encoded list where possible.

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/wire"
)

func (m *Manager) listContainers(ctx context.Context, req *runtimeapi.ListContainersRequest,
	next proxy.UnaryNext[runtimeapi.ListContainersRequest, runtimeapi.ListContainersResponse]) (*runtimeapi.ListContainersResponse, error) {
	// A state filter is applied after the view: an exited old instance that is
	// shown as running must match a "running" filter.
	want := req.GetFilter().GetState()
	if want != nil {
		req.Filter.State = nil
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Containers, err = m.viewContainers(ctx, resp.Containers, want); err != nil {
		return nil, err
	}
	return resp, nil
}

// StreamContainers is ListContainers in batches (kubelets with CRI list
// streaming): every batch goes through the same view.
func (m *Manager) StreamContainers(ctx context.Context, req *runtimeapi.StreamContainersRequest,
	send func(*runtimeapi.StreamContainersResponse) error,
	next proxy.StreamNext[runtimeapi.StreamContainersRequest, runtimeapi.StreamContainersResponse]) error {
	want := req.GetFilter().GetState()
	if want != nil {
		req.Filter.State = nil
	}
	cs, err := next(ctx, req)
	if err != nil {
		return err
	}
	return proxy.Relay(cs, send, func(r *runtimeapi.StreamContainersResponse) (bool, error) {
		var verr error
		r.Containers, verr = m.viewContainers(ctx, r.Containers, want)
		return true, verr
	})
}

// viewContainers classifies unseen exits, then applies the restart view and
// the caller's state filter to a list of containers.
func (m *Manager) viewContainers(ctx context.Context, cs []*runtimeapi.Container, want *runtimeapi.ContainerStateValue) ([]*runtimeapi.Container, error) {
	vs := make([]cview, len(cs))
	for i, c := range cs {
		vs[i] = viewOf(c)
	}
	verdicts, err := m.viewList(ctx, vs, want)
	if err != nil {
		return nil, err
	}
	out := cs[:0]
	for i, c := range cs {
		if verdicts[i].hide {
			continue
		}
		if verdicts[i].fake {
			c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		}
		out = append(out, c)
	}
	return out, nil
}

// viewList decides, for each listed container, whether the kubelet sees it
// and whether it is shown running although it is not. A fake verdict is only
// given to a container that is not running. When an exit's verdict could not
// be recorded the list is not answered (Unavailable): shown as it is, the
// exit would have the kubelet restart the container itself.
//
// Every list records the instances it shows running (Instance.listed), and a
// list without a state filter shows a held instance running (Instance.HeldUntil):
// the kubelet's PLEG reads the statuses of what its unfiltered lists showed.
// A state-filtered list shows held instances as they are: a list of running
// containers is how other callers (housekeeping, the log manager) find what
// still runs, and a replaced instance does not.
func (m *Manager) viewList(ctx context.Context, vs []cview, want *runtimeapi.ContainerStateValue) ([]verdict, error) {
	if err := m.classifyExited(ctx, vs); err != nil {
		return nil, unavailable(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]verdict, len(vs))
	for i, c := range vs {
		state := c.state
		p := m.pods[c.sandbox]
		if p != nil {
			hide, fake := view(p, c.id)
			if hide || pendingCreate(p, c) {
				out[i].hide = true
				continue
			}
			if !fake && want == nil && m.heldLocked(p, c.id) {
				fake = true
			}
			if fake && state != runtimeapi.ContainerState_CONTAINER_RUNNING {
				out[i].fake = true
				state = runtimeapi.ContainerState_CONTAINER_RUNNING
			}
		}
		if want != nil && state != want.State {
			out[i].hide = true
			continue
		}
		if p != nil && state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			if in := p.inst(c.id); in != nil {
				in.listed = true
			}
		}
	}
	return out, nil
}

// listContainersBytes serves an unfiltered ListContainers (the kubelet's
// relist, and its per-pod lists by label) on the encoded messages: the
// response is read with protowire, and only when the view changes something
// is it edited, entry by entry, without decoding the rest. A request with a
// filter, or a message the peek cannot read, takes the decoded path.
func (m *Manager) ListContainersBytes(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	filtered, err := peekListFilter(req)
	if err != nil || filtered {
		return m.listContainersDecoded(ctx, req, next)
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	var vs []cview
	if err := wire.Each(resp, func(f wire.Field) error {
		if f.Num != fListContainers || f.Type != protowire.BytesType {
			return nil
		}
		v, err := peekContainer(f.Bytes)
		vs = append(vs, v)
		return err
	}); err != nil {
		return m.viewDecoded(ctx, resp)
	}
	verdicts, err := m.viewList(ctx, vs, nil)
	if err != nil {
		return nil, err
	}
	for _, v := range verdicts {
		if v.hide || v.fake {
			return editList(resp, verdicts)
		}
	}
	return resp, nil
}

// listContainersDecoded is listContainers on decoded messages, for a
// request listContainersBytes does not serve encoded.
func (m *Manager) listContainersDecoded(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	var r runtimeapi.ListContainersRequest
	if err := proto.Unmarshal(req, &r); err != nil {
		return nil, fmt.Errorf("cri-shim: ListContainersRequest: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	resp, err := m.listContainers(ctx, &r, func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		b, err := proto.Marshal(r)
		if err != nil {
			return nil, err
		}
		out, err := next(ctx, b)
		if err != nil {
			return nil, err
		}
		resp := &runtimeapi.ListContainersResponse{}
		return resp, proto.Unmarshal(out, resp)
	})
	if err != nil {
		return nil, err
	}
	return proto.Marshal(resp)
}

// viewDecoded applies the view to an unfiltered list response it decodes.
func (m *Manager) viewDecoded(ctx context.Context, resp []byte) ([]byte, error) {
	var r runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, fmt.Errorf("cri-shim: runtime's ListContainersResponse: %w: %w", errdefs.ErrInternal, err)
	}
	cs, err := m.viewContainers(ctx, r.Containers, nil)
	if err != nil {
		return nil, err
	}
	r.Containers = cs
	return proto.Marshal(&r)
}
