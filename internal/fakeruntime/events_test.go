package fakeruntime_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// describe is an event in one line: type, whose, the sandbox's state and
// each container's state and exit code.
func describe(ev *runtimeapi.ContainerEventResponse, names map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s sb=", strings.TrimSuffix(strings.TrimPrefix(ev.ContainerEventType.String(), "CONTAINER_"), "_EVENT"), names[ev.ContainerId])
	if ev.PodSandboxStatus == nil {
		b.WriteString("nil")
	} else {
		b.WriteString(strings.TrimPrefix(ev.PodSandboxStatus.State.String(), "SANDBOX_"))
	}
	for _, c := range ev.ContainersStatuses {
		fmt.Fprintf(&b, " %s=%s/%d", names[c.Id], strings.TrimPrefix(c.State.String(), "CONTAINER_"), c.ExitCode)
	}
	return b.String()
}

func subscribe(t *testing.T, rt *fakeruntime.Runtime) grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse] {
	t.Helper()
	s, err := rt.Client().GetContainerEvents(ctxT(t), &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rt.EventStreams() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return s
}

func TestEventsCarrySandboxAndEveryContainerAsContainerdSendsThem(t *testing.T) {
	rt := fakeruntime.Start(t)
	s := subscribe(t, rt)
	sb := runPod(t, rt, nil)
	a := create(t, rt, sb, "a", 0)
	b := create(t, rt, sb, "b", 0)
	start(t, rt, a)
	if err := rt.Exit(a, 1); err != nil {
		t.Fatal(err)
	}
	start(t, rt, b)
	if _, err := rt.Client().RemoveContainer(ctxT(t), &runtimeapi.RemoveContainerRequest{ContainerId: a}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Client().RemovePodSandbox(ctxT(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{sb: "sb", a: "a", b: "b"}
	want := []string{
		"CREATED sb sb=READY",
		"STARTED sb sb=READY",
		"CREATED a sb=READY a=CREATED/0",
		"CREATED b sb=READY a=CREATED/0 b=CREATED/0",
		"STARTED a sb=READY a=RUNNING/0 b=CREATED/0",
		"STOPPED a sb=READY a=EXITED/1 b=CREATED/0",
		"STARTED b sb=READY a=EXITED/1 b=RUNNING/0",
		"DELETED a sb=READY b=RUNNING/0",
		// RemovePodSandbox: stop (containers, then the sandbox), remove the containers, the sandbox.
		"STOPPED b sb=READY b=EXITED/137",
		"STOPPED sb sb=NOTREADY b=EXITED/137",
		"DELETED b sb=NOTREADY",
		// Sent before the sandbox leaves the store (sandbox_remove.go).
		"DELETED sb sb=NOTREADY",
	}
	for i, w := range want {
		ev, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(ev, names); got != w {
			t.Fatalf("event %d: got %q, want %q", i, got, w)
		}
		if ev.CreatedAt == 0 {
			t.Fatalf("event %d has no time", i)
		}
	}
}

func TestEventsHeldForTheFirstSubscriber(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	s := subscribe(t, rt)
	for i, want := range []runtimeapi.ContainerEventType{runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT} {
		ev, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.ContainerId != sb || ev.ContainerEventType != want {
			t.Fatalf("held event %d: %v", i, ev)
		}
	}
}

func TestEndEventStreams(t *testing.T) {
	rt := fakeruntime.Start(t)
	s := subscribe(t, rt)
	rt.EndEventStreams(status.Error(codes.Unavailable, "restarting"))
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream ended with %v", err)
	}
	s = subscribe(t, rt)
	rt.EndEventStreams(nil)
	if _, err := s.Recv(); err != io.EOF {
		t.Fatalf("stream ended cleanly with %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rt.EventStreams() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := rt.EventStreams(); n != 0 {
		t.Fatalf("%d streams open after the drop", n)
	}
	if rt.Calls("GetContainerEvents") != 2 {
		t.Fatalf("GetContainerEvents calls %d", rt.Calls("GetContainerEvents"))
	}
}

func TestCancelledSubscriberDoesNotBlockSenders(t *testing.T) {
	rt := fakeruntime.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := rt.Client().GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{}); err != nil {
		t.Fatal(err)
	}
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 { // well past a subscriber's 100-event buffer
			_, _ = rt.Client().RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{
				Config: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprint(i)}}})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("senders blocked by a subscriber that went away")
	}
}

// A subscriber that does not read holds every sender back once its buffer
// and the stream's flow-control window are full, as containerd's queue does;
// reading lets them go on.
func TestSlowSubscriberHoldsSendersBack(t *testing.T) {
	rt := fakeruntime.Start(t)
	s := subscribe(t, rt)
	const pods = 1500
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range pods {
			_, _ = rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{
				Config: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprint(i)}}})
		}
	}()
	// Wait until the senders stop making progress.
	last := -1
	for {
		time.Sleep(200 * time.Millisecond)
		n, _ := rt.Counts()
		if n == last {
			break
		}
		last = n
	}
	if last == pods {
		t.Fatalf("all %d sandboxes were created with nobody reading their events", pods)
	}
	t.Logf("senders held after %d sandboxes", last)
	for range 2 * pods {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("senders still held after every event was read")
	}
}
