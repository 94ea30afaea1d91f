package events

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// feedSeen is what a subscriber saw of an event; expect names the IDs.
type feedSeen struct {
	id     string
	t      runtimeapi.ContainerEventType
	exit   int32 // -1: the event carries no status of its container
	sbx    string
	second bool // seen by the second subscriber
}

const (
	created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
)

var feedPod = &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "default", Uid: "u-1"}

// feedFixture is a fake runtime and a feed of it with two subscribers.
type feedFixture struct {
	t     *testing.T
	rt    *fakeruntime.Runtime
	feed  *Feed
	got   chan feedSeen
	mu    sync.Mutex
	names map[string]string // IDs to names
}

func (f *feedFixture) name(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.names[id]
}

func (f *feedFixture) setName(id, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names[id] = name
}

// waitLive waits for subscription n of the feed, open at the runtime.
func (f *feedFixture) waitLive(n uint64) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for (f.feed.Live() != n || f.rt.EventStreams() != 1) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if f.feed.Live() != n || f.rt.EventStreams() != 1 {
		f.t.Fatalf("Live() = %d, runtime streams %d; want subscription %d", f.feed.Live(), f.rt.EventStreams(), n)
	}
}

// expect checks the next events, each as the first then the second subscriber saw it.
func (f *feedFixture) expect(want ...feedSeen) {
	f.t.Helper()
	for i, w := range want {
		for _, w := range []feedSeen{w, {id: w.id, second: true}} {
			select {
			case g := <-f.got:
				g.id, g.sbx = f.name(g.id), f.name(g.sbx)
				if g != w {
					f.t.Fatalf("event %d: got %+v, want %+v", i, g, w)
				}
			case <-time.After(5 * time.Second):
				f.t.Fatalf("event %d (%+v) never arrived", i, w)
			}
		}
	}
}

// runExit runs container cname in sb and makes its process exit with code.
func (f *feedFixture) runExit(ctx context.Context, sb, cname string, code int32) {
	f.t.Helper()
	c, err := f.rt.Client().CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: cname},
			Image: &runtimeapi.ImageSpec{Image: fakeruntime.NodeImages[1]}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: feedPod}})
	if err != nil {
		f.t.Fatal(err)
	}
	f.setName(c.ContainerId, cname)
	if _, err := f.rt.Client().StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.rt.Exit(c.ContainerId, code); err != nil {
		f.t.Fatal(err)
	}
}

// TestFeedDeliversToEverySubscriberAndResubscribes follows the runtime's
// events through two ends of its stream: a clean one (subscribe again at
// once) and a failed one (subscribe again after Retry).
func TestFeedDeliversToEverySubscriberAndResubscribes(t *testing.T) {
	f := &feedFixture{t: t, rt: fakeruntime.Start(t), got: make(chan feedSeen, 20), names: map[string]string{}}
	f.feed = NewFeed(f.rt.Conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	f.feed.Retry = 10 * time.Millisecond
	f.feed.Subscribe(func(e *Event) {
		s, err := e.Status()
		if err != nil {
			t.Errorf("status: %v", err)
			return
		}
		exit := int32(-1)
		if s != nil {
			exit = s.ExitCode
		}
		f.got <- feedSeen{id: e.ContainerID, t: e.Type, exit: exit, sbx: e.SandboxID}
	})
	f.feed.Subscribe(func(e *Event) { f.got <- feedSeen{id: e.ContainerID, second: true} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { f.feed.Run(ctx); close(done) }()

	f.waitLive(1)
	sb, err := f.rt.Client().RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{Metadata: feedPod}})
	if err != nil {
		t.Fatal(err)
	}
	f.setName(sb.PodSandboxId, "sb")
	f.runExit(ctx, sb.PodSandboxId, "main", 4)
	f.expect(feedSeen{id: "sb", t: created, exit: -1, sbx: "sb"}, feedSeen{id: "sb", t: started, exit: -1, sbx: "sb"},
		feedSeen{id: "main", t: created, sbx: "sb"}, feedSeen{id: "main", t: started, sbx: "sb"},
		feedSeen{id: "main", t: stopped, exit: 4, sbx: "sb"})

	f.rt.EndEventStreams(nil)
	f.waitLive(2)
	f.runExit(ctx, sb.PodSandboxId, "sidecar", 7)
	f.expect(feedSeen{id: "sidecar", t: created, sbx: "sb"}, feedSeen{id: "sidecar", t: started, sbx: "sb"},
		feedSeen{id: "sidecar", t: stopped, exit: 7, sbx: "sb"})

	f.rt.EndEventStreams(status.Error(codes.Unavailable, "runtime restarting"))
	f.waitLive(3)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if got := f.feed.Live(); got != 0 {
		t.Fatalf("Live() = %d after Run returned", got)
	}
	if n := f.rt.Calls("GetContainerEvents"); n != 3 {
		t.Fatalf("the feed subscribed %d times, want 3 (once, then again after each end)", n)
	}
}
