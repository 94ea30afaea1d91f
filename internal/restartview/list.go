package restartview

// ListContainers and StreamContainers through the engine's view: hidden and
// faked instances, on the encoded list where possible.

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// ListContainersFrames serves an unfiltered ListContainers (the kubelet's
// relist, and its per-pod lists by label) on the encoded messages: the
// runtime's answer is read with protowire in the buffers it arrived in,
// and only when the view changes something is it edited, entry by entry,
// without decoding the rest. A request with a filter, or a message the
// peek cannot read, takes the decoded path.
//
// Every entry's key (ID and sandbox) is read in place, without a copy or
// an allocation, and checked against what the engine may decide about
// (Engine.Interest: the instances of governed pods, but for the quiet ones
// listed running) as the walk reads it; only those entries are kept and
// handed to Verdicts. The others, all of a settled node's list, would be
// shown as they are, and nothing of them is stored. A list with nothing
// to edit is sent on as the runtime's own buffers (asIs).
func (v *View) ListContainersFrames(ctx context.Context, req []byte, next proxy.FramesNext) (resp []byte, asIs bool, err error) {
	filtered, err := wire.PeekListFilter(req)
	if err != nil || filtered {
		resp, err := v.listContainersDecoded(ctx, req, joined(next))
		return resp, false, err
	}
	frames, err := next(ctx, req)
	if err != nil {
		return nil, false, err
	}
	sc := scratchPool.Get().(*listScratch)
	defer sc.release()
	sc.heads, sc.quiet, sc.restarting = v.e.Interest(sc.restarting)
	sc.arena, err = wire.EachInFrames(frames, wire.FieldListContainers, sc.arena[:0], sc.peek)
	if err != nil {
		resp, err := v.viewDecoded(ctx, bytes.Join(frames, nil))
		return resp, false, err
	}
	for _, entry := range sc.raw {
		c, err := wire.PeekContainerBytes(entry)
		if err != nil {
			resp, err := v.viewDecoded(ctx, bytes.Join(frames, nil))
			return resp, false, err
		}
		sc.theirs = append(sc.theirs, c)
	}
	if len(sc.theirs) == 0 {
		return nil, true, nil
	}
	verdicts, err := v.e.Verdicts(ctx, wire.Containers(sc.theirs), nil)
	if err != nil {
		return nil, false, err
	}
	if !slices.ContainsFunc(verdicts, func(vd wire.Verdict) bool { return vd.Hide || vd.Fake }) {
		return nil, true, nil
	}
	all := make([]wire.Verdict, sc.n)
	for k, i := range sc.at {
		all[i] = verdicts[k]
	}
	resp, err = wire.EditList(bytes.Join(frames, nil), all)
	return resp, false, err
}

// ListContainersBytes is ListContainersFrames on an answer in one buffer.
func (v *View) ListContainersBytes(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	var got []byte
	resp, asIs, err := v.ListContainersFrames(ctx, req, func(ctx context.Context, req []byte) ([][]byte, error) {
		b, err := next(ctx, req)
		got = b
		return [][]byte{b}, err
	})
	if asIs {
		return got, err
	}
	return resp, err
}

// joined is next with the answer's frames joined in one buffer.
func joined(next proxy.FramesNext) proxy.BytesNext {
	return func(ctx context.Context, req []byte) ([]byte, error) {
		frames, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		return bytes.Join(frames, nil), nil
	}
}

// listScratch is ListContainersFrames' working memory, reused across
// calls (scratchPool): the kubelet relists every second, and these slices
// would otherwise be allocated anew each time. Only the entries the engine
// may decide about are kept: on a large node, a few in a thousand.
type listScratch struct {
	arena      []byte                // the entries that arrived across two frames
	heads      *wire.HeadSet         // the instances the engine holds (Interest)
	quiet      *wire.HeadSet         // those it shows as they are when running
	restarting []string              // the sandboxes whose restart is in progress
	n          int                   // entries read
	raw        [][]byte              // the entries the engine may decide about
	at         []int                 // and their index in the list
	theirs     []wire.ContainerBytes // read whole
}

var scratchPool = sync.Pool{New: func() any { return new(listScratch) }}

// release empties sc, so that it keeps no reference into a response, and
// returns it to the pool. Slices grown by an unusually large list are let go.
func (sc *listScratch) release() {
	if cap(sc.raw) > maxScratch || cap(sc.arena) > maxArena {
		return
	}
	clear(sc.raw)
	clear(sc.theirs)
	clear(sc.restarting)
	sc.heads, sc.quiet, sc.n = nil, nil, 0
	sc.arena, sc.restarting, sc.raw, sc.at, sc.theirs = sc.arena[:0], sc.restarting[:0], sc.raw[:0], sc.at[:0], sc.theirs[:0]
	scratchPool.Put(sc)
}

// peek reads one listed entry's key and keeps the entry when the engine
// may decide about it; those are read whole afterwards.
func (sc *listScratch) peek(entry []byte) error {
	c, err := wire.PeekContainerKey(entry)
	if err != nil {
		return err
	}
	mine := false
	for _, sb := range sc.restarting {
		mine = mine || string(c.Sandbox) == sb
	}
	if !mine && sc.heads.Has(c.Head) {
		mine = true
		if sc.quiet.Has(c.Head) {
			whole, err := wire.PeekContainerBytes(entry)
			if err != nil {
				return err
			}
			mine = whole.State != runtimeapi.ContainerState_CONTAINER_RUNNING
		}
	}
	if mine {
		sc.raw = append(sc.raw, entry)
		sc.at = append(sc.at, sc.n)
	}
	sc.n++
	return nil
}

// maxScratch is the most kept entries a pooled listScratch keeps room
// for, maxArena the most bytes of entries across frames.
const (
	maxScratch = 4096
	maxArena   = 256 << 10
)

// listContainers is ListContainers on decoded messages. A state filter is
// applied after the view: an exited old instance that is shown as running
// must match a "running" filter.
func (v *View) listContainers(ctx context.Context, req *runtimeapi.ListContainersRequest,
	next proxy.UnaryNext[runtimeapi.ListContainersRequest, runtimeapi.ListContainersResponse]) (*runtimeapi.ListContainersResponse, error) {
	want := req.GetFilter().GetState()
	if want != nil {
		req.Filter.State = nil
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Containers, err = v.viewContainers(ctx, resp.Containers, want); err != nil {
		return nil, err
	}
	return resp, nil
}

// StreamContainers is ListContainers in batches (kubelets with CRI list
// streaming): every batch goes through the same view.
func (v *View) StreamContainers(ctx context.Context, req *runtimeapi.StreamContainersRequest,
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
		r.Containers, verr = v.viewContainers(ctx, r.Containers, want)
		return true, verr
	})
}

// viewContainers applies the engine's verdicts and the caller's state
// filter to a decoded list of containers.
func (v *View) viewContainers(ctx context.Context, cs []*runtimeapi.Container, want *runtimeapi.ContainerStateValue) ([]*runtimeapi.Container, error) {
	vs := make([]wire.Container, len(cs))
	for i, c := range cs {
		vs[i] = wire.ContainerOf(c)
	}
	verdicts, err := v.e.Verdicts(ctx, vs, want)
	if err != nil {
		return nil, err
	}
	out := cs[:0]
	for i, c := range cs {
		if verdicts[i].Hide {
			continue
		}
		if verdicts[i].Fake {
			c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		}
		out = append(out, c)
	}
	return out, nil
}

// listContainersDecoded is listContainers for a request
// ListContainersBytes does not serve encoded.
func (v *View) listContainersDecoded(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	var r runtimeapi.ListContainersRequest
	if err := proto.Unmarshal(req, &r); err != nil {
		return nil, fmt.Errorf("cri-shim: ListContainersRequest: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	resp, err := v.listContainers(ctx, &r, func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
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
func (v *View) viewDecoded(ctx context.Context, resp []byte) ([]byte, error) {
	var r runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, fmt.Errorf("cri-shim: runtime's ListContainersResponse: %w: %w", errdefs.ErrInternal, err)
	}
	cs, err := v.viewContainers(ctx, r.Containers, nil)
	if err != nil {
		return nil, err
	}
	r.Containers = cs
	return proto.Marshal(&r)
}
