package fakeruntime

import (
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// eventLocked builds an event as generateAndSendContainerEvent does: the
// sandbox's status (nil once it is gone) and the status of every container
// of the sandbox, as they are now. r.mu is held; the caller sends it after
// unlocking, as containerd sends after its store updates.
func (r *Runtime) eventLocked(containerID, sandboxID string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	ev := &runtimeapi.ContainerEventResponse{ContainerId: containerID, ContainerEventType: typ, CreatedAt: r.now(),
		ContainersStatuses: []*runtimeapi.ContainerStatus{}}
	if sb := r.sandboxes[sandboxID]; sb != nil {
		ev.PodSandboxStatus = sb.status()
	}
	for _, c := range r.containersOfLocked(sandboxID) {
		ev.ContainersStatuses = append(ev.ContainersStatuses, r.statusLocked(c))
	}
	return ev
}

// GetContainerEvents streams every event from the subscription on
// (container_events.go), events held while nobody subscribed first.
func (r *Runtime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	evs, unsubscribe := r.events.subscribe()
	defer unsubscribe()
	end := make(chan error, 1)
	r.hooksMu.Lock()
	r.streams[end] = struct{}{}
	r.hooksMu.Unlock()
	defer func() {
		r.hooksMu.Lock()
		delete(r.streams, end)
		r.hooksMu.Unlock()
	}()
	for {
		select {
		case <-s.Context().Done():
			return s.Context().Err()
		case err := <-end:
			return err
		case ev, ok := <-evs:
			if !ok {
				return nil
			}
			if err := s.Send(ev); err != nil {
				return err
			}
		}
	}
}

// EventStreams is how many GetContainerEvents streams are open.
func (r *Runtime) EventStreams() int {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	return len(r.streams)
}

// EndEventStreams ends every open GetContainerEvents stream with err, or
// cleanly with nil as containerd's shutdown ends them; the runtime keeps
// serving.
func (r *Runtime) EndEventStreams(err error) {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	for end := range r.streams {
		end <- err
		delete(r.streams, end)
	}
}

// discardAfter is how long events wait for a subscriber (containerd's
// service.go gives its queue five minutes).
const discardAfter = 5 * time.Minute

// eventQueue is containerd's internal/eventq: one goroutine hands every
// event to every subscriber, blocking on a subscriber whose 100-event
// buffer is full, and holds events while there is no subscriber.
type eventQueue struct {
	events    chan *runtimeapi.ContainerEventResponse
	subs      chan subscription
	done      chan struct{}
	closeOnce sync.Once
}

type subscription struct {
	c      chan *runtimeapi.ContainerEventResponse
	closed chan struct{}
}

func (s subscription) publish(ev *runtimeapi.ContainerEventResponse) bool {
	select {
	case <-s.closed:
		return false
	case s.c <- ev:
		return true
	}
}

type heldEvent struct {
	ev *runtimeapi.ContainerEventResponse
	at time.Time
}

func newEventQueue() *eventQueue {
	q := &eventQueue{events: make(chan *runtimeapi.ContainerEventResponse), subs: make(chan subscription), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *eventQueue) run() {
	var held []heldEvent
	var subs []subscription
	for {
		select {
		case <-q.done:
			for _, s := range subs {
				close(s.c)
			}
			return
		case ev := <-q.events:
			active := subs[:0]
			for _, s := range subs {
				if s.publish(ev) {
					active = append(active, s)
				}
			}
			subs = active
			if len(subs) == 0 {
				now := time.Now()
				for len(held) > 0 && now.Sub(held[0].at) > discardAfter {
					held = held[1:]
				}
				held = append(held, heldEvent{ev: ev, at: now})
			}
		case s := <-q.subs:
			ok := true
			for i, h := range held {
				if !s.publish(h.ev) {
					held, ok = held[i:], false
					break
				}
			}
			if ok {
				held = nil
				subs = append(subs, s)
			}
		}
	}
}

func (q *eventQueue) send(evs ...*runtimeapi.ContainerEventResponse) {
	for _, ev := range evs {
		select {
		case <-q.done:
			return
		case q.events <- ev:
		}
	}
}

func (q *eventQueue) subscribe() (<-chan *runtimeapi.ContainerEventResponse, func()) {
	s := subscription{c: make(chan *runtimeapi.ContainerEventResponse, 100), closed: make(chan struct{})}
	select {
	case <-q.done:
		close(s.c)
	case q.subs <- s:
	}
	var once sync.Once
	return s.c, func() { once.Do(func() { close(s.closed) }) }
}

func (q *eventQueue) shutdown() { q.closeOnce.Do(func() { close(q.done) }) }
