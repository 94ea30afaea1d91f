// Package events follows the runtime's container events once for the whole
// shim and hands them to its features, decoded only as far as each one needs.
//
// containerd sends, with every container event, the pod's sandbox status and
// the status of every container of the pod (cri-api ContainerEventResponse,
// fields 4 and 5). Decoding all of that for each event, once per feature, was
// the largest single cost of the shim under a crash loop (docs/backoff.md):
// four events per restart, each several kilobytes of maps and strings. Here the
// message stays as bytes; the container ID, the event type and the sandbox ID
// are read with protowire, and only the event's own container status is
// decoded, and only when a subscriber asks for it.
package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// Field numbers of cri-api's ContainerEventResponse, PodSandboxStatus and
// ContainerStatus that are read without decoding the messages.
const (
	fieldContainerID = 1 // ContainerEventResponse.container_id
	fieldEventType   = 2 // ContainerEventResponse.container_event_type
	fieldSandbox     = 4 // ContainerEventResponse.pod_sandbox_status
	fieldStatuses    = 5 // ContainerEventResponse.containers_statuses
	fieldID          = 1 // PodSandboxStatus.id and ContainerStatus.id
)

// Event is one container event. It is valid only during the subscriber's call:
// the bytes behind it are reused for the next event.
type Event struct {
	ContainerID string
	Type        runtimeapi.ContainerEventType
	SandboxID   string

	raw    []byte
	status *runtimeapi.ContainerStatus
	err    error
	done   bool
}

// Parse reads the container ID, event type and sandbox ID of an encoded
// ContainerEventResponse. It keeps b (without copying) for Status.
func Parse(b []byte) (*Event, error) {
	e := &Event{}
	return e, e.parse(b)
}

func (e *Event) parse(b []byte) error {
	*e = Event{raw: b}
	err := wire.Each(b, func(f wire.Field) error {
		switch {
		case f.Num == fieldContainerID && f.Type == protowire.BytesType:
			e.ContainerID = string(f.Bytes)
		case f.Num == fieldEventType && f.Type == protowire.VarintType:
			e.Type = runtimeapi.ContainerEventType(int32(f.Varint))
		case f.Num == fieldSandbox && f.Type == protowire.BytesType:
			// Repeated occurrences merge, as in proto decoding: an id
			// present in a later one replaces an earlier one.
			id, ok, err := wire.String(f.Bytes, fieldID)
			if err != nil {
				return fmt.Errorf("pod_sandbox_status: %w", err)
			}
			if ok {
				e.SandboxID = id
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("container event: %w", err)
	}
	return nil
}

// Status decodes the status of the event's own container, the one entry of
// containers_statuses whose id is ContainerID; nil when the event carries none.
// Only that entry is decoded.
func (e *Event) Status() (*runtimeapi.ContainerStatus, error) {
	if e.done {
		return e.status, e.err
	}
	e.done = true
	err := wire.Each(e.raw, func(f wire.Field) error {
		if f.Num != fieldStatuses || f.Type != protowire.BytesType {
			return nil
		}
		id, _, err := wire.String(f.Bytes, fieldID)
		if err != nil {
			return fmt.Errorf("containers_statuses: %w", err)
		}
		if id != e.ContainerID {
			return nil
		}
		s := &runtimeapi.ContainerStatus{}
		if err := proto.Unmarshal(f.Bytes, s); err != nil {
			return fmt.Errorf("status of %s: %w", id, err)
		}
		e.status = s
		return nil
	})
	if err != nil {
		e.status, e.err = nil, fmt.Errorf("container event: %w", err)
	}
	return e.status, e.err
}

// Feed is the shim's one subscription to the runtime's container events.
type Feed struct {
	conn grpc.ClientConnInterface
	log  *slog.Logger
	subs []func(*Event)
	// live is the number of the subscription in place, 0 while there is none.
	live  atomic.Uint64
	subs0 uint64
	// Retry is the wait before subscribing again after the stream failed.
	Retry time.Duration
}

// NewFeed follows the events of the runtime behind conn.
func NewFeed(conn grpc.ClientConnInterface, log *slog.Logger) *Feed {
	return &Feed{conn: conn, log: log, Retry: time.Second}
}

// Subscribe adds fn, called for every event in the order the runtime sent
// them. Subscribers are called one after the other on the feed's goroutine:
// fn must not block, and must not keep the event past its return. Subscribe
// before Run.
func (f *Feed) Subscribe(fn func(*Event)) { f.subs = append(f.subs, fn) }

const method = "/runtime.v1.RuntimeService/GetContainerEvents"

// Live returns the number of the subscription in place, or 0 while there is
// none. Events are lost between two subscriptions: a subscriber that needs
// every exit rescans when the number changes (or is 0).
func (f *Feed) Live() uint64 { return f.live.Load() }

// Run follows the events until ctx ends, subscribing again after the runtime
// ends the stream or restarts.
func (f *Feed) Run(ctx context.Context) {
	var buf []byte
	e := &Event{}
	for ctx.Err() == nil {
		err := f.follow(ctx, &buf, e)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, io.EOF) {
			continue
		}
		f.log.Debug("events: container event stream ended; subscribing again", "err", err)
		backoff.Sleep(ctx, f.Retry)
	}
}

func (f *Feed) follow(ctx context.Context, buf *[]byte, e *Event) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	if err := s.SendMsg(&runtimeapi.GetEventsRequest{}); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	f.subs0++
	f.live.Store(f.subs0)
	defer f.live.Store(0)
	for {
		if err := s.RecvMsg(buf); err != nil {
			return err
		}
		if err := e.parse(*buf); err != nil {
			f.log.Warn("events: skipping an undecodable container event", "err", err)
			continue
		}
		for _, fn := range f.subs {
			fn(e)
		}
	}
}

// rawCodec sends proto messages and receives frames into a reused []byte.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("events codec: cannot send %T", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("events codec: cannot receive into %T", v)
	}
	out := (*p)[:0]
	for _, b := range data {
		out = append(out, b.ReadOnlyData()...)
	}
	*p = out
	return nil
}

func (rawCodec) Name() string { return "proto" }
