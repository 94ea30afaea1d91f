// Package ckpttest is the fake containerd the checkpoint packages' tests
// run against (internal/ckptstore, internal/restore, internal/warm), and
// helpers they share.
package ckpttest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// Runtime is containerd for the checkpoint packages: its CRI is the shared
// fake runtime (internal/fakeruntime) over a socket, its task service
// (pause, resume, capture) capturetest's in-memory Tasks.
type Runtime struct {
	runtimeapi.RuntimeServiceClient
	runtimeapi.ImageServiceClient
	RT    *fakeruntime.Runtime
	Tasks *capturetest.Tasks
	epoch time.Time    // containers' timestamps count from here
	clock atomic.Int64 // the runtime's clock while a test sets it (Unix ns); 0: the present

	Mu sync.Mutex
	// dump behaviour
	FailDump map[string]error // container ID -> error of its capture
	HoldDump chan struct{}    // when set, captures wait for it to close
	// DumpAwaitsDiff makes each capture wait (up to 5 s) for the writable
	// layer's diff of its container to be asked, and fail without it.
	DumpAwaitsDiff bool
	diffAsked      map[string]chan struct{}   // closed at each container's first diff
	FailDiff       error                      // every diff fails with it
	DumpSeen       map[string]map[string]bool // container ID -> paused state of every target at its capture
	FailCreate     int                        // CreateContainer call number (1-based) that fails
	Creates        int
	attempts       map[string]uint32 // sandbox/name: containers created, for the kubelet's attempt numbers
	uids           int               // pod UIDs handed out by uid
	dumps          map[string]int    // container ID -> its captures, numbered in their images

	// The pods' runtime shim: at a container's start it claims the
	// container's restore mark, as cmd/containerd-shim-cri-shim-v2 does
	// when containerd creates the task, unless PlainShim (the handler runs
	// containerd's own runc shim). Restored holds what each claimed start
	// restored: its pages image.
	Marks     restoremark.Dir
	PlainShim bool
	Restored  map[string]string
	// RefuseStart, when set, is the runtime shim's own check refusing a
	// claimed mark's images at task create: it records the refusal beside
	// the mark and fails the start, as cmd/containerd-shim-cri-shim-v2 does.
	RefuseStart *restoremark.Refusal
	// Diff, when set, is the writable layer of every capture in place of
	// FakeLayer's.
	Diff []byte
	// Spec, when set, is every container's OCI spec in place of Info's
	// minimal one, and each capture writes the CRIU images criutest.ForSpec
	// makes for it (edited by EditImages, when set) beside its pages:
	// images criucheck.Check accepts, so that a test runs the real checks.
	Spec       *specs.Spec
	EditImages func(*criutest.Images)
	// Memory and Layer are what ContainerStats reports of each container
	// (working set, writable layer); StatsErr, when set, its error.
	Memory, Layer uint64
	StatsErr      error
	StatsCalls    int
}

// ContainerStats answers as containerd's CRI does for a running container,
// with the memory working set and writable layer the test set.
func (f *Runtime) ContainerStats(_ context.Context, req *runtimeapi.ContainerStatsRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatsResponse, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.StatsCalls++
	if f.StatsErr != nil {
		return nil, f.StatsErr
	}
	return &runtimeapi.ContainerStatsResponse{Stats: &runtimeapi.ContainerStats{
		Attributes:    &runtimeapi.ContainerAttributes{Id: req.GetContainerId()},
		Memory:        &runtimeapi.MemoryUsage{WorkingSetBytes: &runtimeapi.UInt64Value{Value: f.Memory}, UsageBytes: &runtimeapi.UInt64Value{Value: 2 * f.Memory}},
		WritableLayer: &runtimeapi.FilesystemUsage{UsedBytes: &runtimeapi.UInt64Value{Value: f.Layer}},
	}}, nil
}

// UID is a new pod UID: the runtime refuses a second sandbox of one pod
// name, namespace, UID and attempt.
func (f *Runtime) UID(prefix string) string {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.uids++
	return fmt.Sprintf("%s-%d", prefix, f.uids)
}

// CreateReq is the kubelet's CreateContainer of name in sandbox: the
// sandbox's configuration and the next attempt number of that name.
func (f *Runtime) CreateReq(t *testing.T, sandbox, name string) *runtimeapi.CreateContainerRequest {
	t.Helper()
	f.Mu.Lock()
	cfg := CtrCfg(name)
	cfg.Metadata.Attempt = f.attempts[sandbox+"/"+name]
	f.attempts[sandbox+"/"+name]++
	f.Mu.Unlock()
	return &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, Config: cfg, SandboxConfig: f.SandboxConfig(t, sandbox)}
}

// Busybox is the image the fake's containers run.
const Busybox = "docker.io/library/busybox:latest"

// NewRuntime is a fake containerd (CRI and tasks) for t, with its clock
// an hour in the past and its restore marks under t's temporary directory.
func NewRuntime(t *testing.T) *Runtime {
	f := &Runtime{Tasks: capturetest.NewTasks(), epoch: time.Now().Add(-time.Hour), FailDump: map[string]error{}, DumpSeen: map[string]map[string]bool{},
		attempts: map[string]uint32{}, Restored: map[string]string{}, dumps: map[string]int{},
		Marks: restoremark.Dir{Path: filepath.Join(t.TempDir(), "marks"), Owner: os.Getuid()}}
	f.RT = fakeruntime.Start(t, fakeruntime.WithClock(func() time.Time {
		if ns := f.clock.Load(); ns != 0 {
			return time.Unix(0, ns)
		}
		return time.Now()
	}))
	f.RuntimeServiceClient, f.ImageServiceClient = f.RT.Client(), f.RT.ImageClient()
	f.RT.OnCall("CreateContainer", func(context.Context, string, any) error {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		f.Creates++
		if f.Creates == f.FailCreate {
			return status.Error(codes.Internal, "fake: restore failed")
		}
		return nil
	})
	f.RT.OnCall("StartContainer", func(_ context.Context, _ string, req any) error {
		f.Mu.Lock()
		plain := f.PlainShim
		f.Mu.Unlock()
		if plain {
			return nil
		}
		id := req.(*runtimeapi.StartContainerRequest).GetContainerId()
		m, err := f.Marks.Claim(id)
		if err != nil {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		f.Mu.Lock()
		refuse := f.RefuseStart
		f.Mu.Unlock()
		if m != nil && refuse != nil {
			if err := f.Marks.Refuse(id, *refuse); err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			return status.Error(codes.FailedPrecondition, "cri-shim restore of "+id+": checkpoint refused: "+refuse.Reason)
		}
		if m != nil {
			b, err := os.ReadFile(filepath.Join(m.Images, "pages-1.img"))
			if err != nil {
				return status.Error(codes.Unknown, "fake: runc restore: "+err.Error())
			}
			f.Mu.Lock()
			f.Restored[id] = string(b)
			f.Mu.Unlock()
		}
		return nil
	})
	if _, err := f.RT.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: Busybox}}); err != nil {
		t.Fatal(err)
	}
	return f
}

// AddSandbox runs sandbox id of pod name in namespace "ns" with a PID
// namespace per container.
func (f *Runtime) AddSandbox(t *testing.T, id, name string) {
	t.Helper()
	f.AddSandboxWith(t, id, name, &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}})
}

// AddSandboxWith runs sandbox id, named name, with the given Linux config.
func (f *Runtime) AddSandboxWith(t *testing.T, id, name string, linux *runtimeapi.LinuxPodSandboxConfig) {
	t.Helper()
	f.RT.NextIDs(id)
	if _, err := f.RT.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + id}, Linux: linux}}); err != nil {
		t.Fatal(err)
	}
}

// SandboxConfig is the configuration the kubelet sends with CreateContainer
// in sandbox id.
func (f *Runtime) SandboxConfig(t *testing.T, id string) *runtimeapi.PodSandboxConfig {
	t.Helper()
	st, ok := f.RT.Sandbox(id)
	if !ok {
		t.Fatalf("no sandbox %s", id)
	}
	return &runtimeapi.PodSandboxConfig{Metadata: st.Metadata, Labels: st.Labels, Annotations: st.Annotations}
}

// AddContainer adds a container created order seconds after the fake's
// epoch, an hour ago: timestamps in the present, as containerd's, in the
// order the test gives. A container that ran has a start (and an exited one a
// finish) time after its creation.
func (f *Runtime) AddContainer(t *testing.T, sandbox, id, name string, state runtimeapi.ContainerState, order int64, exit int32) {
	t.Helper()
	ctx := context.Background()
	created := f.epoch.Add(time.Duration(order) * time.Second)
	defer f.clock.Store(0)
	f.clock.Store(created.UnixNano())
	f.RT.NextIDs(id)
	if _, err := f.RT.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, SandboxConfig: f.SandboxConfig(t, sandbox),
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: Busybox},
			Annotations: map[string]string{capture.RestartCountAnnotation: "2"}}}); err != nil {
		t.Fatal(err)
	}
	if state == runtimeapi.ContainerState_CONTAINER_CREATED {
		return
	}
	f.clock.Store(created.Add(time.Millisecond).UnixNano())
	if _, err := f.RT.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if state == runtimeapi.ContainerState_CONTAINER_EXITED {
		f.clock.Store(created.Add(2 * time.Millisecond).UnixNano())
		if err := f.RT.Exit(id, exit); err != nil {
			t.Fatal(err)
		}
	}
}

// SandboxCount is how many sandboxes the fake holds.
func (f *Runtime) SandboxCount() int { n, _ := f.RT.Counts(); return n }

// ContainerCount is how many containers the fake holds.
func (f *Runtime) ContainerCount() int { _, n := f.RT.Counts(); return n }

// ContainersIn are the statuses of the containers of sandbox, and the
// configurations they were created with.
func (f *Runtime) ContainersIn(t *testing.T, sandbox string) []*Ctr {
	t.Helper()
	list, err := f.RT.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandbox}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*Ctr
	for _, c := range list.Containers {
		out = append(out, f.ContainerOf(t, c.Id))
	}
	return out
}

// Ctr is a container's status and the configuration it was created with.
type Ctr struct {
	Status *runtimeapi.ContainerStatus
	Config *runtimeapi.ContainerConfig
}

// ContainerOf is container id's status and the configuration it was created with.
func (f *Runtime) ContainerOf(t *testing.T, id string) *Ctr {
	t.Helper()
	st, _, ok := f.RT.Container(id)
	if !ok {
		t.Fatalf("no container %s", id)
	}
	c := &Ctr{Status: st}
	for _, r := range f.RT.Requests("CreateContainer") {
		if r := r.(*runtimeapi.CreateContainerRequest); r.Config.GetMetadata().GetName() == st.Metadata.GetName() &&
			r.Config.GetMetadata().GetAttempt() == st.Metadata.GetAttempt() && r.PodSandboxId == f.SandboxOf(id) {
			c.Config = r.Config
		}
	}
	return c
}

// SandboxOf is container id's sandbox ("" when there is no such container).
func (f *Runtime) SandboxOf(id string) string {
	_, sb, _ := f.RT.Container(id)
	return sb
}

// The capture half of Tasks: Checkpoint records which containers were paused
// when it ran, waits if told to, and writes images like CRIU does.
func (f *Runtime) Pause(ctx context.Context, id string) error { return f.Tasks.Pause(ctx, id) }

// Resume and Paused are the fake task service's.
func (f *Runtime) Resume(ctx context.Context, id string) error { return f.Tasks.Resume(ctx, id) }

// Paused is the fake task service's answer.
func (f *Runtime) Paused(ctx context.Context, id string) (bool, error) {
	return f.Tasks.Paused(ctx, id)
}

// Checkpoint writes images as CRIU would, failing as FailDump says.
func (f *Runtime) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	list, err := f.RT.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, c := range list.Containers {
		seen[c.Id] = f.Tasks.IsPaused(c.Id)
	}
	f.Mu.Lock()
	f.DumpSeen[id] = seen
	err, hold := f.FailDump[id], f.HoldDump
	var diffAsked chan struct{}
	if f.DumpAwaitsDiff {
		diffAsked = f.diffChan(id)
	}
	f.Mu.Unlock()
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
		f.Tasks.SetPaused(id, true)
	}
	if err != nil {
		return err
	}
	f.Mu.Lock()
	f.dumps[id]++
	n := f.dumps[id]
	spec, edit := f.Spec, f.EditImages
	f.Mu.Unlock()
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

// diffChan is the channel closed at container id's first diff; f.Mu held.
func (f *Runtime) diffChan(id string) chan struct{} {
	if f.diffAsked == nil {
		f.diffAsked = map[string]chan struct{}{}
	}
	if f.diffAsked[id] == nil {
		f.diffAsked[id] = make(chan struct{})
	}
	return f.diffAsked[id]
}

// RWDiff writes container id's rootfs diff as containerd would.
func (f *Runtime) RWDiff(_ context.Context, id string, w io.Writer) error {
	f.Mu.Lock()
	b, failed := f.Diff, f.FailDiff
	if ch := f.diffChan(id); !isClosed(ch) {
		close(ch)
	}
	f.Mu.Unlock()
	if failed != nil {
		return failed
	}
	if b == nil {
		b = FakeLayer(id)
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

// FakeLayer is container id's writable layer: a gzip layer tar of one file
// of root's, as containerd's diff service writes one.
func FakeLayer(id string) []byte {
	return GzipLayer(&tar.Header{Name: "layer-of-" + id, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(id))}, []byte(id))
}

// GzipLayer is a gzip layer tar of one entry h with data.
func GzipLayer(h *tar.Header, data []byte) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(h)
	tw.Write(data)
	tw.Close()
	zw.Close()
	return b.Bytes()
}

// Info: every container runs as root with two capabilities, or with f.Spec.
func (f *Runtime) Info(_ context.Context, id string) (capture.ContainerInfo, error) {
	f.Mu.Lock()
	spec := f.Spec
	f.Mu.Unlock()
	if spec != nil {
		b, err := json.Marshal(spec)
		return capture.ContainerInfo{Runtime: "io.containerd.runc.v2", Spec: b, Created: f.epoch}, err
	}
	return capture.ContainerInfo{Runtime: "io.containerd.runc.v2", Spec: []byte(`{"ociVersion":"1.2.0","process":{"user":{"uid":0,"gid":0},"cwd":"/",` +
		`"capabilities":{"bounding":["CAP_CHOWN","CAP_KILL"],"permitted":["CAP_CHOWN","CAP_KILL"],"effective":["CAP_CHOWN","CAP_KILL"]}}}`), Created: f.epoch}, nil
}

// NoCaptures is containerd's captures under the fake: no runc runs, so none
// is ever seen running.
type NoCaptures struct{}

// Running finds none, and Wait has nothing to wait for.
func (NoCaptures) Running([]string) []capture.RunningCapture { return nil }

// Wait returns at once.
func (NoCaptures) Wait(context.Context, capture.RunningCapture) error { return nil }

// CtxT is a context that ends after d or with t.
func CtxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Entries are the names in dir.
func Entries(t *testing.T, dir string) []string {
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

// AcceptImages stands in for the image check of archives without CRIU images.
func AcceptImages(string, *specs.Spec) error { return nil }
