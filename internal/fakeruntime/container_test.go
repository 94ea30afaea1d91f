package fakeruntime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

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

// A start whose caller has gone by the time the runtime carries it out (a
// shim killed mid-call) fails as containerd's does: the container is EXITED
// with StartError and was never started.
func TestStartWhoseCallEndedLeavesStartError(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	ctx, cancel := context.WithCancel(ctxT(t))
	rt.OnCall("StartContainer", func(call context.Context, _ string, _ any) error {
		cancel()
		<-call.Done()
		return nil
	})
	_, err := rt.Client().StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled start: %v, want Canceled", err)
	}
	// The runtime goes on with the call after its caller has gone.
	s := cstatus(t, rt, id)
	for deadline := time.Now().Add(5 * time.Second); s.State == runtimeapi.ContainerState_CONTAINER_CREATED && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		s = cstatus(t, rt, id)
	}
	if s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 128 || s.Reason != "StartError" || s.StartedAt != 0 ||
		!strings.Contains(s.Message, "context canceled") {
		t.Fatalf("after a start whose call ended: %v", s)
	}
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
	wantErr(t, err, codes.FailedPrecondition, `failed to reserve container name "main_p_ns_u1_0"; check if another CreateContainer request is in progress: `+
		`name "main_p_ns_u1_0" is reserved for "`+id+`"`)
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

// Between a process's death and containerd recording it, the container is
// RUNNING and a stop changes nothing; the recorded exit keeps the time and
// code of the death, whether record or the sandbox's stop records it.
func TestExitUnrecordedUntilRecorded(t *testing.T) {
	c := &clock{}
	c.set(100)
	rt := fakeruntime.Start(t, fakeruntime.WithClock(c.now))
	sb := runPod(t, rt, nil)
	for _, byKill := range []bool{false, true} {
		id := create(t, rt, sb, fmt.Sprintf("main-%v", byKill), 0)
		start(t, rt, id)
		c.set(200)
		record, err := rt.ExitUnrecorded(id, 1)
		if err != nil {
			t.Fatal(err)
		}
		c.set(300)
		if _, err := rt.Client().StopContainer(ctxT(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 30}); err != nil {
			t.Fatal(err)
		}
		if s := cstatus(t, rt, id); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("stopped while its exit is unrecorded: %v, want RUNNING", s)
		}
		if byKill { // the sandbox's stop kills what runs in it
			if _, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}); err != nil {
				t.Fatal(err)
			}
		} else {
			record()
		}
		if s := cstatus(t, rt, id); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 || s.FinishedAt != 200e9 {
			t.Fatalf("recorded: %v, want EXITED 1 at 200 s", s)
		}
	}
}
