package podstate

// The tests' runtime: an in-memory CRI runtime with containerd's states and
// exit codes (see TestFakeRuntimeStartStopLikeContainerd).

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRT is an in-memory runtime: containers with states and exit codes.
// exitOnStart makes a named container exit with that code as soon as it starts
// (an init container), as a real one would shortly after.
type fakeRT struct {
	mu        sync.Mutex
	n         int
	cs        map[string]*runtimeapi.ContainerStatus
	sandboxOf map[string]string
	created   []string // names, in creation order
	stopped   []string // ids
	// stopTimeouts are the StopContainer timeouts, by container id.
	stopTimeouts map[string]int64
	// execs are the ids of the containers ExecSync ran in (preStop hooks).
	execs       []string
	exitOnStart map[string]int32
	sandboxGone bool
	// sandboxDead: the sandbox is listed NOTREADY and starts fail, as after
	// a StopPodSandbox that bypassed the shim.
	sandboxDead bool
	removed     []string
	statusCalls int
	// failCreates makes that many next creates fail.
	failCreates int
	// logPaths records each created container's log path.
	logPaths map[string]string
	// startGate, when set, holds every StartContainer until it is closed
	// (or the call's context ends, as a gRPC call would); startHeld is told
	// each time a start waits on it.
	startGate chan struct{}
	startHeld chan string
}

func newFakeRT() *fakeRT {
	return &fakeRT{cs: map[string]*runtimeapi.ContainerStatus{}, sandboxOf: map[string]string{}, exitOnStart: map[string]int32{}}
}

func (f *fakeRT) ListContainers(_ context.Context, in *runtimeapi.ListContainersRequest, _ ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*runtimeapi.Container
	for id, s := range f.cs {
		if st := in.GetFilter().GetState(); st != nil && st.State != s.State {
			continue
		}
		if sb := in.GetFilter().GetPodSandboxId(); sb != "" && f.sandboxOf[id] != sb {
			continue
		}
		if !hasLabels(s.Labels, in.GetFilter().GetLabelSelector()) {
			continue
		}
		out = append(out, &runtimeapi.Container{Id: id, PodSandboxId: f.sandboxOf[id], Metadata: s.Metadata, State: s.State, CreatedAt: s.CreatedAt, Labels: s.Labels})
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (f *fakeRT) ContainerStatus(_ context.Context, in *runtimeapi.ContainerStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statusCalls++
	s, ok := f.cs[in.ContainerId]
	if !ok {
		return nil, status.Error(codes.NotFound, "no such container")
	}
	return &runtimeapi.ContainerStatusResponse{Status: proto.Clone(s).(*runtimeapi.ContainerStatus)}, nil
}

func (f *fakeRT) exit(id string, code int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.cs[id]
	s.State, s.ExitCode, s.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, code, time.Now().UnixNano()
}

// StopContainer is containerd's (internal/cri/server/container_stop.go): an
// unknown container is already stopped (success), and only a RUNNING (or
// UNKNOWN) one is killed; a container that has exited keeps its first exit
// code and finish time.
func (f *fakeRT) StopContainer(_ context.Context, in *runtimeapi.StopContainerRequest, _ ...grpc.CallOption) (*runtimeapi.StopContainerResponse, error) {
	f.mu.Lock()
	f.stopped = append(f.stopped, in.ContainerId)
	if f.stopTimeouts == nil {
		f.stopTimeouts = map[string]int64{}
	}
	f.stopTimeouts[in.ContainerId] = in.Timeout
	s, ok := f.cs[in.ContainerId]
	running := ok && (s.State == runtimeapi.ContainerState_CONTAINER_RUNNING || s.State == runtimeapi.ContainerState_CONTAINER_UNKNOWN)
	f.mu.Unlock()
	if running {
		f.exit(in.ContainerId, 137)
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

func (f *fakeRT) CreateContainer(_ context.Context, in *runtimeapi.CreateContainerRequest, _ ...grpc.CallOption) (*runtimeapi.CreateContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failCreates > 0 {
		f.failCreates--
		return nil, status.Error(codes.Unavailable, "create failed")
	}
	// A copy, as a real call marshals it: the caller may change its request afterwards.
	in = proto.Clone(in).(*runtimeapi.CreateContainerRequest)
	f.n++
	id := fmt.Sprintf("c%02d", f.n)
	if f.logPaths == nil {
		f.logPaths = map[string]string{}
	}
	f.logPaths[id] = in.Config.LogPath
	f.cs[id] = &runtimeapi.ContainerStatus{Id: id, Metadata: in.Config.Metadata, State: runtimeapi.ContainerState_CONTAINER_CREATED,
		CreatedAt: time.Now().UnixNano(), Annotations: in.Config.Annotations, Labels: in.Config.Labels, LogPath: in.Config.LogPath}
	f.sandboxOf[id] = in.PodSandboxId
	f.created = append(f.created, in.Config.Metadata.Name)
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// StartContainer is containerd's (internal/cri/server/container_start.go): an
// unknown container is NotFound; one that is not CREATED is refused
// (Unknown, "container is in ... state") and left as it is; a start in a
// sandbox that is not ready fails after the container was marked starting,
// which leaves it EXITED with code 128 (StartError) and no start time.
func (f *fakeRT) StartContainer(ctx context.Context, in *runtimeapi.StartContainerRequest, _ ...grpc.CallOption) (*runtimeapi.StartContainerResponse, error) {
	if f.startGate != nil {
		f.startHeld <- in.ContainerId
		select {
		case <-f.startGate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	f.mu.Lock()
	s, ok := f.cs[in.ContainerId]
	if !ok {
		f.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", in.ContainerId)
	}
	if s.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		f.mu.Unlock()
		return nil, status.Errorf(codes.Unknown, "failed to set starting state for container %q: container is in %s state", in.ContainerId, s.State)
	}
	if f.sandboxDead {
		s.State, s.ExitCode, s.FinishedAt, s.Reason = runtimeapi.ContainerState_CONTAINER_EXITED, 128, time.Now().UnixNano(), "StartError"
		f.mu.Unlock()
		return nil, status.Errorf(codes.Unknown, "sandbox container %q is not running", f.sandboxOf[in.ContainerId])
	}
	s.State, s.StartedAt = runtimeapi.ContainerState_CONTAINER_RUNNING, time.Now().UnixNano()
	code, exits := f.exitOnStart[s.Metadata.Name]
	f.mu.Unlock()
	if exits {
		f.exit(in.ContainerId, code)
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (f *fakeRT) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest, ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{"sb1": !f.sandboxGone}
	var out []*runtimeapi.PodSandbox
	for id := range seen {
		if seen[id] {
			sb := &runtimeapi.PodSandbox{Id: id}
			if f.sandboxDead {
				sb.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
			}
			out = append(out, sb)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

func (f *fakeRT) RemoveContainer(_ context.Context, in *runtimeapi.RemoveContainerRequest, _ ...grpc.CallOption) (*runtimeapi.RemoveContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cs, in.ContainerId)
	f.removed = append(f.removed, in.ContainerId)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (f *fakeRT) ExecSync(_ context.Context, in *runtimeapi.ExecSyncRequest, _ ...grpc.CallOption) (*runtimeapi.ExecSyncResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execs = append(f.execs, in.ContainerId)
	return &runtimeapi.ExecSyncResponse{}, nil
}

// The fake runtime answers StartContainer and StopContainer as containerd
// 2.2 does (internal/cri/server/container_start.go, container_stop.go), which
// the restart machinery's tests depend on.
func TestFakeRuntimeStartStopLikeContainerd(t *testing.T) {
	ctx := context.Background()
	rt := newFakeRT()
	c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "sb1", Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := c.ContainerId
	if s := rt.cs[id]; time.Since(time.Unix(0, s.CreatedAt)) > time.Minute {
		t.Fatalf("created at %s: the fake's clock is not in the present", time.Unix(0, s.CreatedAt))
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); status.Code(err) != codes.Unknown {
		t.Fatalf("second start of a running container: %v, want Unknown (container is in RUNNING state)", err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("start of an unknown container: %v, want NotFound", err)
	}
	rt.exit(id, 3)
	first := proto.Clone(rt.cs[id]).(*runtimeapi.ContainerStatus)
	time.Sleep(time.Millisecond)
	for _, cid := range []string{id, "nope"} {
		if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: cid}); err != nil {
			t.Fatalf("stop of %s: %v, want success (idempotent)", cid, err)
		}
	}
	if s := rt.cs[id]; s.ExitCode != 3 || s.FinishedAt != first.FinishedAt {
		t.Fatalf("stop of an exited container changed it: exit %d finished %d, want 3 and %d", s.ExitCode, s.FinishedAt, first.FinishedAt)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); status.Code(err) != codes.Unknown {
		t.Fatalf("start of an exited container: %v, want Unknown", err)
	}
}

// hasLabels is containerd's label selector match: every key present with its value.
func hasLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
