package fakeruntime_test

import (
	"context"
	"errors"
	"slices"
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

func create(t *testing.T, rt *fakeruntime.Runtime, sb, name string, attempt uint32) string {
	t.Helper()
	resp, err := rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
			Image: &runtimeapi.ImageSpec{Image: "busybox"}, Labels: map[string]string{"c": name}, LogPath: name + ".log"},
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

func TestContainerTimestampsAndExitAcrossItsLife(t *testing.T) {
	c := &clock{}
	c.set(100)
	rt := fakeruntime.Start(t, fakeruntime.WithClock(c.now))
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	s := cstatus(t, rt, id)
	if s.State != runtimeapi.ContainerState_CONTAINER_CREATED || s.CreatedAt != 100e9 || s.StartedAt != 0 || s.FinishedAt != 0 ||
		s.LogPath != "/logs/main.log" || s.ImageRef == "" || s.Reason != "" {
		t.Fatalf("created: %v", s)
	}
	c.set(200)
	start(t, rt, id)
	s = cstatus(t, rt, id)
	if s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || s.StartedAt != 200e9 || s.FinishedAt != 0 {
		t.Fatalf("running: %v", s)
	}
	c.set(300)
	if err := rt.Exit(id, 3); err != nil {
		t.Fatal(err)
	}
	s = cstatus(t, rt, id)
	if s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 3 || s.Reason != "Error" || s.StartedAt != 200e9 || s.FinishedAt != 300e9 {
		t.Fatalf("exited: %v", s)
	}
	if err := rt.Exit(id, 0); err == nil {
		t.Fatal("an exited container exited again")
	}
	id2 := create(t, rt, sb, "ok", 0)
	start(t, rt, id2)
	if err := rt.Exit(id2, 0); err != nil {
		t.Fatal(err)
	}
	if s := cstatus(t, rt, id2); s.Reason != "Completed" {
		t.Fatalf("exit 0: reason %q", s.Reason)
	}
	id3 := create(t, rt, sb, "oom", 0)
	start(t, rt, id3)
	if err := rt.OOMKill(id3); err != nil {
		t.Fatal(err)
	}
	if s := cstatus(t, rt, id3); s.Reason != "OOMKilled" || s.ExitCode != 137 {
		t.Fatalf("oom: %v", s)
	}
}

func TestStartOnlyFromCreated(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	start(t, rt, id)
	_, err := rt.Client().StartContainer(ctxT(t), &runtimeapi.StartContainerRequest{ContainerId: id})
	wantErr(t, err, codes.Unknown, `failed to set starting state for container "`+id+`": container is in CONTAINER_RUNNING state`)
	if err := rt.Exit(id, 1); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Client().StartContainer(ctxT(t), &runtimeapi.StartContainerRequest{ContainerId: id})
	wantErr(t, err, codes.Unknown, `failed to set starting state for container "`+id+`": container is in CONTAINER_EXITED state`)
	if s := cstatus(t, rt, id); s.ExitCode != 1 || s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("a refused start changed the container: %v", s)
	}
	_, err = rt.Client().StartContainer(ctxT(t), &runtimeapi.StartContainerRequest{ContainerId: "nope"})
	wantErr(t, err, codes.NotFound, `an error occurred when try to find container "nope": not found`)
}

func TestStartInSandboxNotReadyLeavesStartError(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	if err := rt.SandboxExit(sb); err != nil {
		t.Fatal(err)
	}
	_, err := rt.Client().StartContainer(ctxT(t), &runtimeapi.StartContainerRequest{ContainerId: id})
	wantErr(t, err, codes.Unknown, `sandbox container "`+sb+`" is not running`)
	s := cstatus(t, rt, id)
	if s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 128 || s.Reason != "StartError" || s.StartedAt != 0 || s.FinishedAt == 0 {
		t.Fatalf("after a failed start: %v", s)
	}
	_, err = rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "late"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	wantErr(t, err, codes.Unknown, `sandbox container "`+sb+`" is not running`)
}

func TestStopContainerKillsOnlyRunningAndKeepsFirstExit(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	stop := func(id string, timeout int64) {
		t.Helper()
		if _, err := rt.Client().StopContainer(ctxT(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: timeout}); err != nil {
			t.Fatal(err)
		}
	}
	term, kill, created := create(t, rt, sb, "term", 0), create(t, rt, sb, "kill", 0), create(t, rt, sb, "created", 0)
	start(t, rt, term)
	start(t, rt, kill)
	stop(term, 30)
	stop(kill, 0)
	stop(created, 0)
	stop("unknown", 0)
	if s := cstatus(t, rt, term); s.ExitCode != 143 || s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("stopped with a timeout: %v", s)
	}
	if s := cstatus(t, rt, kill); s.ExitCode != 137 {
		t.Fatalf("stopped without a timeout: %v", s)
	}
	if s := cstatus(t, rt, created); s.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Fatalf("a created container was stopped: %v", s)
	}
	first := cstatus(t, rt, term)
	stop(term, 0)
	if s := cstatus(t, rt, term); s.ExitCode != 143 || s.FinishedAt != first.FinishedAt {
		t.Fatalf("a second stop changed the first exit: %v", s)
	}
}

func TestRemoveContainerKillsRunningAndReleasesName(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	start(t, rt, id)
	_, err := rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	wantErr(t, err, codes.Unknown, `failed to reserve container name "main_p_ns_u1_0": name "main_p_ns_u1_0" is reserved for "`+id+`"`)
	if _, err := rt.Client().RemoveContainer(ctxT(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Client().ContainerStatus(ctxT(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	wantErr(t, err, codes.NotFound, `an error occurred when try to find container "`+id+`": not found`)
	if _, err := rt.Client().RemoveContainer(ctxT(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("removing a removed container: %v", err)
	}
	create(t, rt, sb, "main", 0) // the name is free again
	if got := len(rt.Requests("RemoveContainer")); got != 2 {
		t.Fatalf("recorded %d RemoveContainer requests", got)
	}
}

func TestSandboxStopAndRemove(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	host := runPod(t, rt, &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "h", Namespace: "ns", Uid: "u2"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}})
	if s := sbstatus(t, rt, sb); s.State != runtimeapi.PodSandboxState_SANDBOX_READY || s.Network.Ip == "" || s.CreatedAt == 0 {
		t.Fatalf("new sandbox: %v", s)
	}
	if s := sbstatus(t, rt, host); s.Network.Ip != "" {
		t.Fatalf("a sandbox on the node's network has IP %q", s.Network.Ip)
	}
	_, err := rt.Client().RunPodSandbox(ctxT(t), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	wantErr(t, err, codes.Unknown, `failed to reserve sandbox name "p_ns_u1_0": name "p_ns_u1_0" is reserved for "`+sb+`"`)
	id := create(t, rt, sb, "main", 0)
	start(t, rt, id)
	if _, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
	if s := sbstatus(t, rt, sb); s.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || s.Network.Ip != "" {
		t.Fatalf("stopped sandbox: %v", s)
	}
	if s := cstatus(t, rt, id); s.ExitCode != 137 {
		t.Fatalf("container of a stopped sandbox: %v", s)
	}
	if _, err := rt.Client().RemovePodSandbox(ctxT(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Client().PodSandboxStatus(ctxT(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	wantErr(t, err, codes.NotFound, "an error occurred when try to find sandbox: not found")
	if _, _, ok := rt.Container(id); ok {
		t.Fatal("a removed sandbox's container remains")
	}
	for _, call := range []func() error{
		func() error {
			_, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb})
			return err
		},
		func() error {
			_, err := rt.Client().RemovePodSandbox(ctxT(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatalf("stop or remove of a removed sandbox: %v", err)
		}
	}
	runPod(t, rt, nil) // the name is free again
}

func TestListFilters(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb1 := runPod(t, rt, nil)
	sb2 := runPod(t, rt, &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "q", Namespace: "ns", Uid: "u2"},
		Labels: map[string]string{"app": "b"}})
	a, b := create(t, rt, sb1, "a", 0), create(t, rt, sb1, "b", 0)
	start(t, rt, a)
	resp, err := rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb2,
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "a"}, Labels: map[string]string{"c": "a"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "q", Namespace: "ns", Uid: "u2"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerId
	running := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	for name, tc := range map[string]struct {
		f    *runtimeapi.ContainerFilter
		want []string
	}{
		"none":         {nil, []string{a, b, c}},
		"id":           {&runtimeapi.ContainerFilter{Id: b}, []string{b}},
		"id prefix":    {&runtimeapi.ContainerFilter{Id: b[:12]}, []string{b}},
		"sandbox":      {&runtimeapi.ContainerFilter{PodSandboxId: sb2}, []string{c}},
		"state":        {&runtimeapi.ContainerFilter{State: running}, []string{a}},
		"labels":       {&runtimeapi.ContainerFilter{LabelSelector: map[string]string{"c": "a"}}, []string{a, c}},
		"all of them":  {&runtimeapi.ContainerFilter{PodSandboxId: sb1, LabelSelector: map[string]string{"c": "a"}, State: running}, []string{a}},
		"unknown id":   {&runtimeapi.ContainerFilter{Id: "nope"}, nil},
		"label absent": {&runtimeapi.ContainerFilter{LabelSelector: map[string]string{"x": ""}}, nil},
	} {
		got, err := rt.Client().ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{Filter: tc.f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range got.Containers {
			ids = append(ids, c.Id)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("%s: got %v, want %v", name, ids, tc.want)
		}
	}
	if _, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb2}); err != nil {
		t.Fatal(err)
	}
	ready := &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}
	for name, tc := range map[string]struct {
		f    *runtimeapi.PodSandboxFilter
		want []string
	}{
		"none":      {nil, []string{sb1, sb2}},
		"id prefix": {&runtimeapi.PodSandboxFilter{Id: sb2[:10]}, []string{sb2}},
		"state":     {&runtimeapi.PodSandboxFilter{State: ready}, []string{sb1}},
		"labels":    {&runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "b"}}, []string{sb2}},
	} {
		got, err := rt.Client().ListPodSandbox(ctxT(t), &runtimeapi.ListPodSandboxRequest{Filter: tc.f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range got.Items {
			ids = append(ids, s.Id)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("sandboxes %s: got %v, want %v", name, ids, tc.want)
		}
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

func TestExecSyncOnlyInRunningContainers(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	exec := func(id string) error {
		_, err := rt.Client().ExecSync(ctxT(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"true"}})
		return err
	}
	wantErr(t, exec(id), codes.Unknown, "failed to exec in container: container is in CONTAINER_CREATED state")
	start(t, rt, id)
	if err := exec(id); err != nil {
		t.Fatal(err)
	}
	wantErr(t, exec("nope"), codes.NotFound, `failed to exec in container: failed to find container "nope" in store: not found`)
}

func TestImagesPulledListedAndRemoved(t *testing.T) {
	rt := fakeruntime.Start(t)
	img := rt.ImageClient()
	spec := &runtimeapi.ImageSpec{Image: "busybox"} // the image create uses
	if st, err := img.ImageStatus(ctxT(t), &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.Image != nil {
		t.Fatalf("an image never pulled: %v %v", st, err)
	}
	pulled, err := img.PullImage(ctxT(t), &runtimeapi.PullImageRequest{Image: spec})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{spec.Image, pulled.ImageRef} {
		st, err := img.ImageStatus(ctxT(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil || st.Image.GetId() != pulled.ImageRef || !slices.Contains(st.Image.RepoTags, spec.Image) {
			t.Fatalf("status by %q: %v %v", name, st, err)
		}
	}
	sb := runPod(t, rt, nil)
	if s := cstatus(t, rt, create(t, rt, sb, "main", 0)); s.ImageRef != pulled.ImageRef {
		t.Fatalf("container image ref %q, want the pulled %q", s.ImageRef, pulled.ImageRef)
	}
	if l, err := img.ListImages(ctxT(t), &runtimeapi.ListImagesRequest{}); err != nil || len(l.Images) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	for range 2 { // the second removal is of an unknown image: success
		if _, err := img.RemoveImage(ctxT(t), &runtimeapi.RemoveImageRequest{Image: spec}); err != nil {
			t.Fatal(err)
		}
	}
	if l, _ := img.ListImages(ctxT(t), &runtimeapi.ListImagesRequest{}); len(l.Images) != 0 {
		t.Fatalf("after removal: %v", l.Images)
	}
}
