package criu

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRT is the part of containerd's CRI the service uses, in memory. Only
// the methods the service calls are implemented; any other panics (nil
// embedded interface), which a test would notice.
type fakeRT struct {
	runtimeapi.RuntimeServiceClient
	runtimeapi.ImageServiceClient
	tasks *fakeTasks
	epoch time.Time // containers' timestamps count from here

	mu         sync.Mutex
	sandboxes  map[string]*runtimeapi.PodSandboxStatus
	containers map[string]*fakeCtr
	nextID     int

	// dump behaviour
	failDump   map[string]error           // container ID -> error of its capture
	holdDump   chan struct{}              // when set, captures wait for it to close
	dumpSeen   map[string]map[string]bool // container ID -> paused state of every target at its capture
	failCreate int                        // CreateContainer call number (1-based) that fails
	creates    int
	removed    []string
}

type fakeCtr struct {
	sandbox string
	status  *runtimeapi.ContainerStatus
	config  *runtimeapi.ContainerConfig
}

func newFakeRT() *fakeRT {
	return &fakeRT{tasks: newFakeTasks(), epoch: time.Now().Add(-time.Hour), sandboxes: map[string]*runtimeapi.PodSandboxStatus{},
		containers: map[string]*fakeCtr{}, failDump: map[string]error{}, dumpSeen: map[string]map[string]bool{}}
}

func (f *fakeRT) addSandbox(id, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[id] = &runtimeapi.PodSandboxStatus{Id: id, State: runtimeapi.PodSandboxState_SANDBOX_READY,
		Linux:    &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}},
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + id}}
}

// addContainer adds a container created order seconds after the fake's
// epoch, an hour ago: timestamps in the present, as containerd's, in the
// order the test gives. A container that ran has a start (and an exited one a
// finish) time after its creation.
func (f *fakeRT) addContainer(sandbox, id, name string, state runtimeapi.ContainerState, order int64, exit int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	created := f.epoch.Add(time.Duration(order) * time.Second)
	st := &runtimeapi.ContainerStatus{
		Id: id, Metadata: &runtimeapi.ContainerMetadata{Name: name}, State: state, CreatedAt: created.UnixNano(), ExitCode: exit,
		Image: &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"}, ImageRef: "sha256:abc",
		Annotations: map[string]string{restartCountAnnotation: "2"},
	}
	if state == runtimeapi.ContainerState_CONTAINER_RUNNING || state == runtimeapi.ContainerState_CONTAINER_EXITED {
		st.StartedAt = created.Add(time.Millisecond).UnixNano()
	}
	if state == runtimeapi.ContainerState_CONTAINER_EXITED {
		st.FinishedAt = created.Add(2 * time.Millisecond).UnixNano()
	}
	f.containers[id] = &fakeCtr{sandbox: sandbox, status: st}
}

// ImageStatus: every busybox name is one image, as in a real image store.
func (f *fakeRT) ImageStatus(_ context.Context, r *runtimeapi.ImageStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error) {
	if strings.Contains(r.GetImage().GetImage(), "busybox") || r.GetImage().GetImage() == "sha256:abc" {
		return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:b0b0"}}, nil
	}
	return &runtimeapi.ImageStatusResponse{}, nil
}

func (f *fakeRT) Version(context.Context, *runtimeapi.VersionRequest, ...grpc.CallOption) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake", RuntimeVersion: "1"}, nil
}

func (f *fakeRT) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest, _ ...grpc.CallOption) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PodSandboxId]
	if sb == nil {
		return nil, status.Errorf(codes.NotFound, "sandbox %q not found", r.PodSandboxId)
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: sb}, nil
}

func (f *fakeRT) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest, _ ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &runtimeapi.ListContainersResponse{}
	for id, c := range f.containers {
		if r.GetFilter().GetPodSandboxId() != "" && c.sandbox != r.GetFilter().GetPodSandboxId() {
			continue
		}
		out.Containers = append(out.Containers, &runtimeapi.Container{Id: id, PodSandboxId: c.sandbox,
			Metadata: c.status.Metadata, State: c.status.State, CreatedAt: c.status.CreatedAt})
	}
	return out, nil
}

func (f *fakeRT) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[r.ContainerId]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "container %q not found", r.ContainerId)
	}
	return &runtimeapi.ContainerStatusResponse{Status: c.status}, nil
}

// The capture half of Tasks: Checkpoint records which containers were paused
// when it ran, waits if told to, and writes images like CRIU does.
func (f *fakeRT) Pause(ctx context.Context, id string) error  { return f.tasks.Pause(ctx, id) }
func (f *fakeRT) Resume(ctx context.Context, id string) error { return f.tasks.Resume(ctx, id) }
func (f *fakeRT) Paused(ctx context.Context, id string) (bool, error) {
	return f.tasks.Paused(ctx, id)
}

func (f *fakeRT) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	f.mu.Lock()
	seen := map[string]bool{}
	for cid := range f.containers {
		seen[cid] = f.tasks.isPaused(cid)
	}
	f.dumpSeen[id] = seen
	err, hold := f.failDump[id], f.holdDump
	f.mu.Unlock()
	if hold != nil {
		<-hold
		// A real capture that ends after the caller resumed restores the
		// freezer state it found: frozen.
		f.tasks.setPaused(id, true)
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, "pages-1.img"), []byte("criu images of "+id), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(workDir, "dump.log"), []byte("dump ok"), 0o600)
}

func (f *fakeRT) RWDiff(_ context.Context, id string, w io.Writer) error {
	_, err := io.WriteString(w, "layer of "+id)
	return err
}

func (f *fakeRT) Info(_ context.Context, id string) (ContainerInfo, error) {
	return ContainerInfo{Runtime: "io.containerd.runc.v2", Spec: []byte(`{"ociVersion":"1.2.0"}`), Created: f.epoch}, nil
}

func (f *fakeRT) RunPodSandbox(_ context.Context, r *runtimeapi.RunPodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.RunPodSandboxResponse, error) {
	f.mu.Lock()
	f.nextID++
	id := fmt.Sprintf("restored-sb-%d", f.nextID)
	f.mu.Unlock()
	f.addSandbox(id, r.GetConfig().GetMetadata().GetName())
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func (f *fakeRT) CreateContainer(_ context.Context, r *runtimeapi.CreateContainerRequest, _ ...grpc.CallOption) (*runtimeapi.CreateContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates++
	if f.creates == f.failCreate {
		return nil, status.Error(codes.Internal, "fake: restore failed")
	}
	f.nextID++
	id := fmt.Sprintf("restored-c-%d", f.nextID)
	f.containers[id] = &fakeCtr{sandbox: r.PodSandboxId, config: r.Config, status: &runtimeapi.ContainerStatus{
		Id: id, Metadata: r.Config.Metadata, State: runtimeapi.ContainerState_CONTAINER_CREATED, Image: r.Config.Image,
		CreatedAt: time.Now().UnixNano()}}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (f *fakeRT) RemoveContainer(_ context.Context, r *runtimeapi.RemoveContainerRequest, _ ...grpc.CallOption) (*runtimeapi.RemoveContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.containers, r.ContainerId)
	f.removed = append(f.removed, r.ContainerId)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (f *fakeRT) StopPodSandbox(context.Context, *runtimeapi.StopPodSandboxRequest, ...grpc.CallOption) (*runtimeapi.StopPodSandboxResponse, error) {
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (f *fakeRT) RemovePodSandbox(_ context.Context, r *runtimeapi.RemovePodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, r.PodSandboxId)
	f.removed = append(f.removed, r.PodSandboxId)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (f *fakeRT) containersIn(sandbox string) []*fakeCtr {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*fakeCtr
	for _, c := range f.containers {
		if c.sandbox == sandbox {
			out = append(out, c)
		}
	}
	return out
}

// fakeTasks is containerd's task service: a paused flag per container.
type fakeTasks struct {
	mu          sync.Mutex
	paused      map[string]bool
	failPause   map[string]bool
	failResumes int // this many Resume calls fail before they work
	pauses      int
}

func newFakeTasks() *fakeTasks {
	return &fakeTasks{paused: map[string]bool{}, failPause: map[string]bool{}}
}

func (t *fakeTasks) Pause(_ context.Context, id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failPause[id] {
		return status.Error(codes.Unknown, "fake: cannot pause")
	}
	t.paused[id] = true
	t.pauses++
	return nil
}

func (t *fakeTasks) Resume(_ context.Context, id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failResumes > 0 {
		t.failResumes--
		return status.Error(codes.Unavailable, "fake: containerd is restarting")
	}
	if !t.paused[id] {
		return status.Error(codes.FailedPrecondition, "cannot resume a running process")
	}
	t.paused[id] = false
	return nil
}

func (t *fakeTasks) Paused(_ context.Context, id string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.paused[id], nil
}

func (t *fakeTasks) isPaused(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.paused[id]
}

func (t *fakeTasks) setPaused(id string, p bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.paused[id] = p
}

func (t *fakeTasks) anyPaused() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id, p := range t.paused {
		if p {
			out = append(out, id)
		}
	}
	return out
}

type fixture struct {
	rt   *fakeRT
	svc  *Service
	root string
	dir  string
}

// newFixture: a sandbox "sb1" with running containers c1 (app) and c2
// (sidecar), an exited init container, and a sandbox "sb2" with c3.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "checkpoints")
	rt := newFakeRT()
	rt.addSandbox("sb1", "pod1")
	rt.addSandbox("sb2", "pod2")
	rt.addContainer("sb1", "c2", "sidecar", runtimeapi.ContainerState_CONTAINER_RUNNING, 20, 0)
	rt.addContainer("sb1", "c1", "app", runtimeapi.ContainerState_CONTAINER_RUNNING, 30, 0)
	rt.addContainer("sb1", "i1", "init", runtimeapi.ContainerState_CONTAINER_EXITED, 10, 0)
	rt.addContainer("sb1", "x1", "done", runtimeapi.ContainerState_CONTAINER_CREATED, 40, 0)
	rt.addContainer("sb2", "c3", "other", runtimeapi.ContainerState_CONTAINER_RUNNING, 50, 0)
	svc, err := New(Config{Root: root, StateDir: filepath.Join(base, "state"), ShimBinary: "/usr/bin/cri-shim"}, rt, rt, rt,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	svc.retryEvery = 10 * time.Millisecond
	svc.marginBase, svc.marginPer = 10*time.Millisecond, 5*time.Millisecond
	dir := filepath.Join(root, "cp1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return &fixture{rt: rt, svc: svc, root: root, dir: dir}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
