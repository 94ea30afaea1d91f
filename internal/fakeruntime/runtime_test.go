package fakeruntime_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// clock is a settable clock for WithClock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(sec int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = time.Unix(sec, 0)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var podMeta = &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "u1"}

func runPod(t *testing.T, rt *fakeruntime.Runtime, cfg *runtimeapi.PodSandboxConfig) string {
	t.Helper()
	if cfg == nil {
		cfg = &runtimeapi.PodSandboxConfig{Metadata: podMeta, Labels: map[string]string{"app": "a"}}
	}
	resp, err := rt.Client().RunPodSandbox(ctxT(t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return resp.PodSandboxId
}

// busybox is the image a test node holds (fakeruntime.NodeImages).
const busybox = "docker.io/library/busybox:cri-shim"

func create(t *testing.T, rt *fakeruntime.Runtime, sb, name string, attempt uint32) string {
	t.Helper()
	resp, err := rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
			Image: &runtimeapi.ImageSpec{Image: busybox}, Labels: map[string]string{"c": name}, LogPath: name + ".log"},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: podMeta, LogDirectory: "/logs"}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ContainerId
}

func start(t *testing.T, rt *fakeruntime.Runtime, id string) {
	t.Helper()
	if _, err := rt.Client().StartContainer(ctxT(t), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
}

func cstatus(t *testing.T, rt *fakeruntime.Runtime, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	resp, err := rt.Client().ContainerStatus(ctxT(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

func sbstatus(t *testing.T, rt *fakeruntime.Runtime, id string) *runtimeapi.PodSandboxStatus {
	t.Helper()
	resp, err := rt.Client().PodSandboxStatus(ctxT(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

func wantErr(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if st := status.Convert(err); err == nil || st.Code() != code || st.Message() != msg {
		t.Fatalf("got %v, want %v %q", err, code, msg)
	}
}

func TestHooksInjectCountAndRecord(t *testing.T) {
	rt := fakeruntime.Start(t)
	boom := status.Error(codes.Unavailable, "boom")
	rt.FailNext("RunPodSandbox", 1, boom)
	_, err := rt.Client().RunPodSandbox(ctxT(t), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	wantErr(t, err, codes.Unavailable, "boom")
	if n, _ := rt.Counts(); n != 0 {
		t.Fatal("a failed call had an effect")
	}
	sb := runPod(t, rt, nil)
	if rt.Calls("RunPodSandbox") != 2 || len(rt.Requests("RunPodSandbox")) != 2 {
		t.Fatalf("calls %d", rt.Calls("RunPodSandbox"))
	}
	var seen string
	rt.OnCall("CreateContainer", func(_ context.Context, method string, req any) error {
		seen = method + ":" + req.(*runtimeapi.CreateContainerRequest).Config.Metadata.Name
		if seen == "CreateContainer:refused" {
			return errors.New("refused by hook")
		}
		return nil
	})
	_, err = rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "refused"}}, SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	if err == nil || seen != "CreateContainer:refused" {
		t.Fatalf("hook: %v %q", err, seen)
	}
	rt.OnCall("CreateContainer", nil)
	rt.ExitOnStart("crash", 2)
	id := create(t, rt, sb, "crash", 0)
	start(t, rt, id)
	if s := cstatus(t, rt, id); s.ExitCode != 2 || s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.StartedAt == 0 {
		t.Fatalf("exit on start: %v", s)
	}
}

func TestNextIDsAndRewrite(t *testing.T) {
	rt := fakeruntime.Start(t)
	rt.NextIDs("sb", "c1")
	if sb := runPod(t, rt, nil); sb != "sb" {
		t.Fatalf("sandbox ID %q", sb)
	}
	if id := create(t, rt, "sb", "main", 0); id != "c1" {
		t.Fatalf("container ID %q", id)
	}
	if id := create(t, rt, "sb", "next", 0); len(id) != 64 {
		t.Fatalf("after the named IDs: %q", id)
	}
	rt.Rewrite("PodSandboxStatus", func(m proto.Message) { m.(*runtimeapi.PodSandboxStatusResponse).Status.Network.Ip = "" })
	if s := sbstatus(t, rt, "sb"); s.Network.Ip != "" {
		t.Fatalf("rewritten IP %q", s.Network.Ip)
	}
	rt.Rewrite("PodSandboxStatus", nil)
	if s := sbstatus(t, rt, "sb"); s.Network.Ip == "" {
		t.Fatal("the rewrite changed the runtime's state")
	}
}
