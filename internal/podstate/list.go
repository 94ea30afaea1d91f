package podstate

// ListContainers and StreamContainers through the restart view: hidden and
// faked instances, on the encoded list where possible.

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	if resp.Containers, err = m.viewContainers(ctx, resp.Containers, want, want == nil && isFull(req.GetFilter())); err != nil {
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
		r.Containers, verr = m.viewContainers(ctx, r.Containers, want, want == nil && isFull(req.GetFilter()))
		return true, verr
	})
}

// isFull says whether a list (its state filter already taken out) shows every
// container, as the kubelet's PLEG relist does.
func isFull(f *runtimeapi.ContainerFilter) bool {
	return f.GetState() == nil && f.GetId() == "" && f.GetPodSandboxId() == "" && len(f.GetLabelSelector()) == 0
}

// sawSandboxList notes a ListPodSandbox without a filter: an encoded request
// of at most 2 bytes (no filter, or an empty one, as the kubelet sends).
func (m *Manager) sawSandboxList(reqLen int) {
	if reqLen > 2 || m.Tracked() == 0 {
		return
	}
	now := time.Now().UnixNano()
	m.sandboxListAt.Store(now)
	m.sandboxListSeen.Store(now)
}

// relistWindow is how soon after its sandbox list the PLEG lists containers.
const relistWindow = 500 * time.Millisecond

// isRelist says whether a full container list is the PLEG's relist, which
// the kubelet's next status reads follow, rather than the stats provider's,
// which nothing follows. The PLEG lists every sandbox and then every
// container (kuberuntime_manager.go, GetPods); the CRI stats provider lists
// every container and then every sandbox (stats/cri_stats_provider.go,
// getPodAndContainerMaps), with the same empty filters. A container list
// that closely follows a sandbox list is the relist. A caller that never
// lists sandboxes (not a kubelet v1.36) has every full list taken as one.
func (m *Manager) isRelist() bool {
	seen := m.sandboxListSeen.Load()
	if seen == 0 || time.Since(time.Unix(0, seen)) > 10*time.Second {
		return true
	}
	at := m.sandboxListAt.Swap(0)
	return at != 0 && time.Since(time.Unix(0, at)) < relistWindow
}

// viewContainers classifies unseen exits, then applies the restart view and
// the caller's state filter to a list of containers.
func (m *Manager) viewContainers(ctx context.Context, cs []*runtimeapi.Container, want *runtimeapi.ContainerStateValue, full bool) ([]*runtimeapi.Container, error) {
	vs := make([]cview, len(cs))
	for i, c := range cs {
		vs[i] = viewOf(c)
	}
	verdicts, err := m.viewList(ctx, vs, want, full)
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
func (m *Manager) viewList(ctx context.Context, vs []cview, want *runtimeapi.ContainerStateValue, full bool) ([]verdict, error) {
	if err := m.classifyExited(ctx, vs); err != nil {
		return nil, unavailable(err)
	}
	// Only the PLEG's relist releases holds and records what was shown: the
	// kubelet's next statuses follow it (see Pod.KeepShown).
	full = full && m.isRelist()
	m.mu.Lock()
	defer m.mu.Unlock()
	if full {
		for _, p := range m.pods {
			p.KeepShown = nil
			clear(p.shownRunning)
		}
	}
	out := make([]verdict, len(vs))
	for i, c := range vs {
		state := c.state
		p := m.pods[c.sandbox]
		if p != nil {
			hide, fake := m.view(p, c.id)
			if hide || pendingCreate(p, c) {
				out[i].hide = true
				continue
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
		if full && p != nil && state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			if p.shownRunning == nil {
				p.shownRunning = map[string]bool{}
			}
			p.shownRunning[c.id] = true
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
		return m.viewDecoded(ctx, resp, true)
	}
	verdicts, err := m.viewList(ctx, vs, nil, true)
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
		return nil, status.Errorf(codes.InvalidArgument, "cri-shim: ListContainersRequest: %v", err)
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
func (m *Manager) viewDecoded(ctx context.Context, resp []byte, full bool) ([]byte, error) {
	var r runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, status.Errorf(codes.Internal, "cri-shim: runtime's ListContainersResponse: %v", err)
	}
	cs, err := m.viewContainers(ctx, r.Containers, nil, full)
	if err != nil {
		return nil, err
	}
	r.Containers = cs
	return proto.Marshal(&r)
}
