package e2e

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRI is an in-memory CRI runtime served on a unix socket, for driving
// the real shim binary through more pods than the real stack can create in
// a test's time (the churn test). It keeps containerd's answers where the
// shim depends on them: StartContainer only of a CREATED container,
// StopContainer idempotent and keeping the first exit, Stop/Remove of
// unknown objects succeeding, and a container event stream (created,
// started, stopped, deleted) with the sandbox's and container's status.
type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	mu         sync.Mutex
	n          int
	sandboxes  map[string]*runtimeapi.PodSandboxStatus
	containers map[string]*fakeContainer
	subs       map[chan *runtimeapi.ContainerEventResponse]struct{}
}

type fakeContainer struct {
	sandbox string
	status  *runtimeapi.ContainerStatus
	labels  map[string]string
}

func newFakeCRI() *fakeCRI {
	return &fakeCRI{sandboxes: map[string]*runtimeapi.PodSandboxStatus{}, containers: map[string]*fakeContainer{},
		subs: map[chan *runtimeapi.ContainerEventResponse]struct{}{}}
}

// serve serves f on sock until the returned stop is called.
func (f *fakeCRI) serve(sock string) (stop func(), err error) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(gs, f)
	runtimeapi.RegisterImageServiceServer(gs, f)
	go func() { _ = gs.Serve(l) }()
	return gs.Stop, nil
}

// emit sends an event to every subscriber; f.mu is held.
func (f *fakeCRI) emit(id string, typ runtimeapi.ContainerEventType) {
	c := f.containers[id]
	if c == nil {
		return
	}
	ev := &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ, CreatedAt: time.Now().UnixNano(),
		PodSandboxStatus: f.sandboxes[c.sandbox], ContainersStatuses: []*runtimeapi.ContainerStatus{c.status}}
	for ch := range f.subs {
		select {
		case ch <- ev:
		default: // a subscriber that does not keep up misses events, as with containerd's bounded queue
		}
	}
}

func (f *fakeCRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "1", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeCRI) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: true}}}}, nil
}

func (f *fakeCRI) RunPodSandbox(_ context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	id := fmt.Sprintf("sb%08d", f.n)
	cfg := r.GetConfig()
	st := &runtimeapi.PodSandboxStatus{Id: id, Metadata: cfg.GetMetadata(), State: runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt: time.Now().UnixNano(), Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(),
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()}}}
	if cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() != runtimeapi.NamespaceMode_NODE {
		// TEST-NET-1 (RFC 5737): a pod address that is never the host's and never answers.
		st.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: fmt.Sprintf("192.0.2.%d", 1+f.n%250)}
	}
	f.sandboxes[id] = st
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func (f *fakeCRI) StopPodSandbox(_ context.Context, r *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PodSandboxId]
	if sb == nil {
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	for id, c := range f.containers {
		if c.sandbox == r.PodSandboxId {
			f.exitLocked(id, 137)
		}
	}
	sb.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (f *fakeCRI) RemovePodSandbox(_ context.Context, r *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, c := range f.containers {
		if c.sandbox == r.PodSandboxId {
			f.exitLocked(id, 137)
			f.emit(id, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
			delete(f.containers, id)
		}
	}
	delete(f.sandboxes, r.PodSandboxId)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (f *fakeCRI) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PodSandboxId]
	if sb == nil {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox %q: not found", r.PodSandboxId)
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: sb}, nil
}

func (f *fakeCRI) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &runtimeapi.ListPodSandboxResponse{}
	for id, sb := range f.sandboxes {
		if want := r.GetFilter().GetId(); want != "" && want != id {
			continue
		}
		out.Items = append(out.Items, &runtimeapi.PodSandbox{Id: id, Metadata: sb.Metadata, State: sb.State, CreatedAt: sb.CreatedAt,
			Labels: sb.Labels, Annotations: sb.Annotations})
	}
	return out, nil
}

func (f *fakeCRI) CreateContainer(_ context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PodSandboxId]
	if sb == nil || sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.Unknown, "sandbox %q is not ready", r.PodSandboxId)
	}
	f.n++
	id := fmt.Sprintf("c%08d", f.n)
	cfg := r.GetConfig()
	f.containers[id] = &fakeContainer{sandbox: r.PodSandboxId, labels: cfg.GetLabels(), status: &runtimeapi.ContainerStatus{
		Id: id, Metadata: cfg.GetMetadata(), State: runtimeapi.ContainerState_CONTAINER_CREATED, CreatedAt: time.Now().UnixNano(),
		Image: cfg.GetImage(), ImageRef: "sha256:fake", Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(), LogPath: cfg.GetLogPath()}}
	f.emit(id, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (f *fakeCRI) StartContainer(_ context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[r.ContainerId]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", r.ContainerId)
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		return nil, status.Errorf(codes.Unknown, "failed to set starting state for container %q: container is in %s state", r.ContainerId, c.status.State)
	}
	c.status.State, c.status.StartedAt = runtimeapi.ContainerState_CONTAINER_RUNNING, time.Now().UnixNano()
	f.emit(r.ContainerId, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	return &runtimeapi.StartContainerResponse{}, nil
}

// exit ends a running container with code, as its process exiting would.
func (f *fakeCRI) exit(id string, code int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exitLocked(id, code)
}

func (f *fakeCRI) exitLocked(id string, code int32) {
	c := f.containers[id]
	if c == nil || c.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	c.status.State, c.status.ExitCode, c.status.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, code, time.Now().UnixNano()
	c.status.Reason = "Error"
	f.emit(id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
}

func (f *fakeCRI) StopContainer(_ context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	f.exit(r.ContainerId, 137)
	return &runtimeapi.StopContainerResponse{}, nil
}

func (f *fakeCRI) RemoveContainer(_ context.Context, r *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.containers[r.ContainerId]; c != nil {
		if c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return nil, status.Errorf(codes.Unknown, "container %q is running, stop it first", r.ContainerId)
		}
		f.emit(r.ContainerId, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
		delete(f.containers, r.ContainerId)
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (f *fakeCRI) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[r.ContainerId]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", r.ContainerId)
	}
	return &runtimeapi.ContainerStatusResponse{Status: c.status}, nil
}

func (f *fakeCRI) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &runtimeapi.ListContainersResponse{}
	flt := r.GetFilter()
	for id, c := range f.containers {
		if (flt.GetId() != "" && flt.GetId() != id) || (flt.GetPodSandboxId() != "" && flt.GetPodSandboxId() != c.sandbox) ||
			(flt.GetState() != nil && flt.GetState().State != c.status.State) {
			continue
		}
		out.Containers = append(out.Containers, &runtimeapi.Container{Id: id, PodSandboxId: c.sandbox, Metadata: c.status.Metadata,
			Image: c.status.Image, ImageRef: c.status.ImageRef, State: c.status.State, CreatedAt: c.status.CreatedAt,
			Labels: c.status.Labels, Annotations: c.status.Annotations})
	}
	return out, nil
}

func (f *fakeCRI) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	ch := make(chan *runtimeapi.ContainerEventResponse, 1024)
	f.mu.Lock()
	f.subs[ch] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}()
	for {
		select {
		case <-s.Context().Done():
			return s.Context().Err()
		case ev := <-ch:
			if err := s.Send(ev); err != nil {
				return err
			}
		}
	}
}

func (f *fakeCRI) counts() (sandboxes, containers int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sandboxes), len(f.containers)
}
