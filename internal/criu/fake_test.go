package criu

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/stats"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/capture/capturetest"
	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restoremark"
	"github.com/cri-shim/cri-shim/internal/store"
)

// fakeRT is containerd for the service: its CRI is the shared fake runtime
// (internal/fakeruntime) over a socket, its task service (pause, resume,
// capture) the in-memory fakeTasks below.
type fakeRT struct {
	runtimeapi.RuntimeServiceClient
	runtimeapi.ImageServiceClient
	rt    *fakeruntime.Runtime
	tasks *capturetest.Tasks
	epoch time.Time    // containers' timestamps count from here
	clock atomic.Int64 // the runtime's clock while a test sets it (Unix ns); 0: the present

	mu sync.Mutex
	// dump behaviour
	failDump map[string]error // container ID -> error of its capture
	holdDump chan struct{}    // when set, captures wait for it to close
	// dumpAwaitsDiff makes each capture wait (up to 5 s) for the writable
	// layer's diff of its container to be asked, and fail without it.
	dumpAwaitsDiff bool
	diffAsked      map[string]chan struct{}   // closed at each container's first diff
	failDiff       error                      // every diff fails with it
	dumpSeen       map[string]map[string]bool // container ID -> paused state of every target at its capture
	failCreate     int                        // CreateContainer call number (1-based) that fails
	creates        int
	removed        []string          // IDs of RemoveContainer and RemovePodSandbox calls, in order
	attempts       map[string]uint32 // sandbox/name: containers created, for the kubelet's attempt numbers
	uids           int               // pod UIDs handed out by uid
	dumps          map[string]int    // container ID -> its captures, numbered in their images

	// The pods' runtime shim: at a container's start it claims the
	// container's restore mark, as cmd/containerd-shim-cri-shim-v2 does
	// when containerd creates the task, unless plainShim (the handler runs
	// containerd's own runc shim). restored holds what each claimed start
	// restored: its pages image.
	marks     restoremark.Dir
	plainShim bool
	restored  map[string]string
	// refuseStart, when set, is the runtime shim's own check refusing a
	// claimed mark's images at task create: it records the refusal beside
	// the mark and fails the start, as cmd/containerd-shim-cri-shim-v2 does.
	refuseStart *restoremark.Refusal
	// diff, when set, is the writable layer of every capture in place of
	// fakeLayer's.
	diff []byte
	// spec, when set, is every container's OCI spec in place of Info's
	// minimal one, and each capture writes the CRIU images criutest.ForSpec
	// makes for it (edited by editImages, when set) beside its pages:
	// images criucheck.Check accepts, so that a test runs the real checks.
	spec       *specs.Spec
	editImages func(*criutest.Images)
	// memory and layer are what ContainerStats reports of each container
	// (working set, writable layer); statsErr, when set, its error.
	memory, layer uint64
	statsErr      error
	statsCalls    int
}

// ContainerStats answers as containerd's CRI does for a running container,
// with the memory working set and writable layer the test set.
func (f *fakeRT) ContainerStats(_ context.Context, req *runtimeapi.ContainerStatsRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statsCalls++
	if f.statsErr != nil {
		return nil, f.statsErr
	}
	return &runtimeapi.ContainerStatsResponse{Stats: &runtimeapi.ContainerStats{
		Attributes:    &runtimeapi.ContainerAttributes{Id: req.GetContainerId()},
		Memory:        &runtimeapi.MemoryUsage{WorkingSetBytes: &runtimeapi.UInt64Value{Value: f.memory}, UsageBytes: &runtimeapi.UInt64Value{Value: 2 * f.memory}},
		WritableLayer: &runtimeapi.FilesystemUsage{UsedBytes: &runtimeapi.UInt64Value{Value: f.layer}},
	}}, nil
}

// uid is a new pod UID: the runtime refuses a second sandbox of one pod
// name, namespace, UID and attempt.
func (f *fakeRT) uid(prefix string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uids++
	return fmt.Sprintf("%s-%d", prefix, f.uids)
}

// createReq is the kubelet's CreateContainer of name in sandbox: the
// sandbox's configuration and the next attempt number of that name.
func (f *fakeRT) createReq(t *testing.T, sandbox, name string) *runtimeapi.CreateContainerRequest {
	t.Helper()
	f.mu.Lock()
	cfg := ctrCfg(name)
	cfg.Metadata.Attempt = f.attempts[sandbox+"/"+name]
	f.attempts[sandbox+"/"+name]++
	f.mu.Unlock()
	return &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, Config: cfg, SandboxConfig: f.sandboxConfig(t, sandbox)}
}

const busybox = "docker.io/library/busybox:latest"

func newFakeRT(t *testing.T) *fakeRT {
	f := &fakeRT{tasks: capturetest.NewTasks(), epoch: time.Now().Add(-time.Hour), failDump: map[string]error{}, dumpSeen: map[string]map[string]bool{},
		attempts: map[string]uint32{}, restored: map[string]string{}, dumps: map[string]int{},
		marks: restoremark.Dir{Path: filepath.Join(t.TempDir(), "marks"), Owner: os.Getuid()}}
	f.rt = fakeruntime.Start(t, fakeruntime.WithClock(func() time.Time {
		if ns := f.clock.Load(); ns != 0 {
			return time.Unix(0, ns)
		}
		return time.Now()
	}))
	f.RuntimeServiceClient, f.ImageServiceClient = f.rt.Client(), f.rt.ImageClient()
	f.rt.OnCall("CreateContainer", func(context.Context, string, any) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.creates++
		if f.creates == f.failCreate {
			return status.Error(codes.Internal, "fake: restore failed")
		}
		return nil
	})
	f.rt.OnCall("StartContainer", func(_ context.Context, _ string, req any) error {
		f.mu.Lock()
		plain := f.plainShim
		f.mu.Unlock()
		if plain {
			return nil
		}
		id := req.(*runtimeapi.StartContainerRequest).GetContainerId()
		m, err := f.marks.Claim(id)
		if err != nil {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		f.mu.Lock()
		refuse := f.refuseStart
		f.mu.Unlock()
		if m != nil && refuse != nil {
			if err := f.marks.Refuse(id, *refuse); err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			return status.Error(codes.FailedPrecondition, "cri-shim restore of "+id+": checkpoint refused: "+refuse.Reason)
		}
		if m != nil {
			b, err := os.ReadFile(filepath.Join(m.Images, "pages-1.img"))
			if err != nil {
				return status.Error(codes.Unknown, "fake: runc restore: "+err.Error())
			}
			f.mu.Lock()
			f.restored[id] = string(b)
			f.mu.Unlock()
		}
		return nil
	})
	if _, err := f.rt.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: busybox}}); err != nil {
		t.Fatal(err)
	}
	return f
}

// addSandbox runs sandbox id of pod name in namespace "ns" with a PID
// namespace per container.
func (f *fakeRT) addSandbox(t *testing.T, id, name string) {
	t.Helper()
	f.addSandboxWith(t, id, name, &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}})
}

func (f *fakeRT) addSandboxWith(t *testing.T, id, name string, linux *runtimeapi.LinuxPodSandboxConfig) {
	t.Helper()
	f.rt.NextIDs(id)
	if _, err := f.rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + id}, Linux: linux}}); err != nil {
		t.Fatal(err)
	}
}

// sandboxConfig is the configuration the kubelet sends with CreateContainer
// in sandbox id.
func (f *fakeRT) sandboxConfig(t *testing.T, id string) *runtimeapi.PodSandboxConfig {
	t.Helper()
	st, ok := f.rt.Sandbox(id)
	if !ok {
		t.Fatalf("no sandbox %s", id)
	}
	return &runtimeapi.PodSandboxConfig{Metadata: st.Metadata, Labels: st.Labels, Annotations: st.Annotations}
}

// addContainer adds a container created order seconds after the fake's
// epoch, an hour ago: timestamps in the present, as containerd's, in the
// order the test gives. A container that ran has a start (and an exited one a
// finish) time after its creation.
func (f *fakeRT) addContainer(t *testing.T, sandbox, id, name string, state runtimeapi.ContainerState, order int64, exit int32) {
	t.Helper()
	ctx := context.Background()
	created := f.epoch.Add(time.Duration(order) * time.Second)
	defer f.clock.Store(0)
	f.clock.Store(created.UnixNano())
	f.rt.NextIDs(id)
	if _, err := f.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, SandboxConfig: f.sandboxConfig(t, sandbox),
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: busybox},
			Annotations: map[string]string{capture.RestartCountAnnotation: "2"}}}); err != nil {
		t.Fatal(err)
	}
	if state == runtimeapi.ContainerState_CONTAINER_CREATED {
		return
	}
	f.clock.Store(created.Add(time.Millisecond).UnixNano())
	if _, err := f.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if state == runtimeapi.ContainerState_CONTAINER_EXITED {
		f.clock.Store(created.Add(2 * time.Millisecond).UnixNano())
		if err := f.rt.Exit(id, exit); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fakeRT) sandboxCount() int   { n, _ := f.rt.Counts(); return n }
func (f *fakeRT) containerCount() int { _, n := f.rt.Counts(); return n }

// containersIn are the statuses of the containers of sandbox, and the
// configurations they were created with.
func (f *fakeRT) containersIn(t *testing.T, sandbox string) []*fakeCtr {
	t.Helper()
	list, err := f.rt.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandbox}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*fakeCtr
	for _, c := range list.Containers {
		out = append(out, f.container(t, c.Id))
	}
	return out
}

// fakeCtr is a container's status and the configuration it was created with.
type fakeCtr struct {
	status *runtimeapi.ContainerStatus
	config *runtimeapi.ContainerConfig
}

func (f *fakeRT) container(t *testing.T, id string) *fakeCtr {
	t.Helper()
	st, _, ok := f.rt.Container(id)
	if !ok {
		t.Fatalf("no container %s", id)
	}
	c := &fakeCtr{status: st}
	for _, r := range f.rt.Requests("CreateContainer") {
		if r := r.(*runtimeapi.CreateContainerRequest); r.Config.GetMetadata().GetName() == st.Metadata.GetName() &&
			r.Config.GetMetadata().GetAttempt() == st.Metadata.GetAttempt() && r.PodSandboxId == f.sandboxOf(id) {
			c.config = r.Config
		}
	}
	return c
}

func (f *fakeRT) sandboxOf(id string) string {
	_, sb, _ := f.rt.Container(id)
	return sb
}

// The capture half of Tasks: Checkpoint records which containers were paused
// when it ran, waits if told to, and writes images like CRIU does.
func (f *fakeRT) Pause(ctx context.Context, id string) error  { return f.tasks.Pause(ctx, id) }
func (f *fakeRT) Resume(ctx context.Context, id string) error { return f.tasks.Resume(ctx, id) }
func (f *fakeRT) Paused(ctx context.Context, id string) (bool, error) {
	return f.tasks.Paused(ctx, id)
}

func (f *fakeRT) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	list, err := f.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, c := range list.Containers {
		seen[c.Id] = f.tasks.IsPaused(c.Id)
	}
	f.mu.Lock()
	f.dumpSeen[id] = seen
	err, hold := f.failDump[id], f.holdDump
	var diffAsked chan struct{}
	if f.dumpAwaitsDiff {
		diffAsked = f.diffChan(id)
	}
	f.mu.Unlock()
	if diffAsked != nil {
		select {
		case <-diffAsked:
		case <-time.After(5 * time.Second):
			return fmt.Errorf("fake: the diff of %s was not asked during its capture", id)
		}
	}
	if hold != nil {
		<-hold
		// A real capture that ends after the caller resumed restores the
		// freezer state it found: frozen.
		f.tasks.SetPaused(id, true)
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.dumps[id]++
	n := f.dumps[id]
	spec, edit := f.spec, f.editImages
	f.mu.Unlock()
	pages := []byte(fmt.Sprintf("criu images of %s, capture %d", id, n))
	if spec != nil {
		im := criutest.ForSpec(spec)
		if edit != nil {
			edit(im)
		}
		im.Raw["pages-1.img"] = pages
		if err := im.Write(imageDir); err != nil {
			return err
		}
	} else if err := os.WriteFile(filepath.Join(imageDir, "pages-1.img"), pages, 0o600); err != nil {
		return err
	}
	// CRIU's statistics: a fixed account, 4 pages written.
	if err := capturetest.WriteDumpStats(workDir, &stats.DumpStatsEntry{FreezingTime: proto.Uint32(1), FrozenTime: proto.Uint32(3000),
		MemdumpTime: proto.Uint32(1000), MemwriteTime: proto.Uint32(2000), PagesScanned: proto.Uint64(4), PagesSkippedParent: proto.Uint64(0),
		PagesWritten: proto.Uint64(4), PagesLazy: proto.Uint64(0)}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(workDir, "dump.log"), []byte("dump ok"), 0o600)
}

// diffChan is the channel closed at container id's first diff; f.mu held.
func (f *fakeRT) diffChan(id string) chan struct{} {
	if f.diffAsked == nil {
		f.diffAsked = map[string]chan struct{}{}
	}
	if f.diffAsked[id] == nil {
		f.diffAsked[id] = make(chan struct{})
	}
	return f.diffAsked[id]
}

func (f *fakeRT) RWDiff(_ context.Context, id string, w io.Writer) error {
	f.mu.Lock()
	b, failed := f.diff, f.failDiff
	if ch := f.diffChan(id); !isClosed(ch) {
		close(ch)
	}
	f.mu.Unlock()
	if failed != nil {
		return failed
	}
	if b == nil {
		b = fakeLayer(id)
	}
	_, err := w.Write(b)
	return err
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// fakeLayer is container id's writable layer: a gzip layer tar of one file
// of root's, as containerd's diff service writes one.
func fakeLayer(id string) []byte {
	return gzipLayer(&tar.Header{Name: "layer-of-" + id, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(id))}, []byte(id))
}

// gzipLayer is a gzip layer tar of one entry h with data.
func gzipLayer(h *tar.Header, data []byte) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(h)
	tw.Write(data)
	tw.Close()
	zw.Close()
	return b.Bytes()
}

// Info: every container runs as root with two capabilities, or with f.spec.
func (f *fakeRT) Info(_ context.Context, id string) (capture.ContainerInfo, error) {
	f.mu.Lock()
	spec := f.spec
	f.mu.Unlock()
	if spec != nil {
		b, err := json.Marshal(spec)
		return capture.ContainerInfo{Runtime: "io.containerd.runc.v2", Spec: b, Created: f.epoch}, err
	}
	return capture.ContainerInfo{Runtime: "io.containerd.runc.v2", Spec: []byte(`{"ociVersion":"1.2.0","process":{"user":{"uid":0,"gid":0},"cwd":"/",` +
		`"capabilities":{"bounding":["CAP_CHOWN","CAP_KILL"],"permitted":["CAP_CHOWN","CAP_KILL"],"effective":["CAP_CHOWN","CAP_KILL"]}}}`), Created: f.epoch}, nil
}

type fixture struct {
	rt    *fakeRT
	svc   *Service
	root  string
	dir   string
	table *podtable.Table // the node's sandboxes: sync after adding some
}

// noCaptures is containerd's captures under the fake: no runc runs, so none
// is ever seen running.
type noCaptures struct{}

func (noCaptures) Running([]string) []capture.RunningCapture          { return nil }
func (noCaptures) Wait(context.Context, capture.RunningCapture) error { return nil }

// newFixture: a sandbox "sb1" with running containers c1 (app) and c2
// (sidecar), an exited init container, and a sandbox "sb2" with c3.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, nil)
}

// newFixtureWith is newFixture with the service's configuration and task
// service chosen by setup (nil: the defaults, and the fake runtime's tasks).
func newFixtureWith(t *testing.T, setup func(rt *fakeRT, cfg *Config) capture.Tasks) *fixture {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "checkpoints")
	rt := newFakeRT(t)
	rt.addSandbox(t, "sb1", "pod1")
	rt.addSandbox(t, "sb2", "pod2")
	rt.addContainer(t, "sb1", "c2", "sidecar", runtimeapi.ContainerState_CONTAINER_RUNNING, 20, 0)
	rt.addContainer(t, "sb1", "c1", "app", runtimeapi.ContainerState_CONTAINER_RUNNING, 30, 0)
	rt.addContainer(t, "sb1", "i1", "init", runtimeapi.ContainerState_CONTAINER_EXITED, 10, 0)
	rt.addContainer(t, "sb1", "x1", "done", runtimeapi.ContainerState_CONTAINER_CREATED, 40, 0)
	rt.addContainer(t, "sb2", "c3", "other", runtimeapi.ContainerState_CONTAINER_RUNNING, 50, 0)
	st, err := store.Open(store.RootIn(filepath.Join(base, "state")))
	if err != nil {
		t.Fatal(err)
	}
	table := podtable.New(rt, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	fx := &fixture{rt: rt, root: root, table: table}
	cfg := Config{Root: root, StateDir: filepath.Join(base, "state"), Store: st, Sandboxes: table, ShimBinary: "/usr/bin/cri-shim", RestoreMarks: rt.marks,
		CaptureTiming: capture.Timing{Dump: 10 * time.Minute, Resume: 10 * time.Second, RetryEvery: 10 * time.Millisecond,
			MarginBase: 10 * time.Millisecond, MarginPer: 5 * time.Millisecond},
		Captures: noCaptures{}}
	var tasks capture.Tasks = rt
	if setup != nil {
		tasks = setup(rt, &cfg)
	}
	svc, err := New(cfg, rt, rt, tasks, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	// The fake's archives hold no CRIU images (pages-1.img is a line of
	// text): the images check is criucheck's, tested there and on the real
	// stack; these tests take every checkpoint (restore_check_test.go
	// tests the refusal path).
	svc.imageCheck = acceptImages
	dir := filepath.Join(root, "cp1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	fx.svc, fx.dir = svc, dir
	return fx
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

func acceptImages(string, *specs.Spec) error { return nil }
