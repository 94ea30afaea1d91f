package podstate

import (
	"context"
	"fmt"
	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
)

// fakeRT is an in-memory runtime: containers with states and exit codes.
// exitOnStart makes a named container exit with that code as soon as it starts
// (an init container), as a real one would shortly after.
type fakeRT struct {
	mu          sync.Mutex
	n           int
	cs          map[string]*runtimeapi.ContainerStatus
	sandboxOf   map[string]string
	created     []string // names, in creation order
	stopped     []string // ids
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
		out = append(out, &runtimeapi.Container{Id: id, PodSandboxId: f.sandboxOf[id], Metadata: s.Metadata, State: s.State, CreatedAt: s.CreatedAt})
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
		CreatedAt: time.Now().UnixNano(), Annotations: in.Config.Annotations, LogPath: in.Config.LogPath}
	f.sandboxOf[id] = in.PodSandboxId
	f.created = append(f.created, in.Config.Metadata.Name)
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// StartContainer is containerd's (internal/cri/server/container_start.go): an
// unknown container is NotFound; one that is not CREATED is refused
// (Unknown, "container is in ... state") and left as it is; a start in a
// sandbox that is not ready fails after the container was marked starting,
// which leaves it EXITED with code 128 (StartError) and no start time.
func (f *fakeRT) StartContainer(_ context.Context, in *runtimeapi.StartContainerRequest, _ ...grpc.CallOption) (*runtimeapi.StartContainerResponse, error) {
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

func (f *fakeRT) ExecSync(context.Context, *runtimeapi.ExecSyncRequest, ...grpc.CallOption) (*runtimeapi.ExecSyncResponse, error) {
	return &runtimeapi.ExecSyncResponse{}, nil
}

// kubelet plays the kubelet's part through the manager's route functions.
type kubelet struct {
	t  *testing.T
	m  *Manager
	rt *fakeRT
}

func (k kubelet) runPod(annotations map[string]string) string {
	resp, err := k.m.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata:    &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-1"},
		Annotations: annotations,
	}}, func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
		return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sb1"}, nil
	})
	if err != nil {
		k.t.Fatal(err)
	}
	return resp.PodSandboxId
}

// start creates and starts a container as the kubelet does (restart count 0).
func (k kubelet) start(sb, name string) string {
	req := &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name},
		Annotations: map[string]string{annotationRestartCount: "0", annotationGracePeriod: "0"},
		LogPath:     name + "/0.log",
	}}
	resp, err := k.m.CreateContainer(context.Background(), req, func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		return k.rt.CreateContainer(ctx, r)
	})
	if err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		k.t.Fatal(err)
	}
	return resp.ContainerId
}

// status reads a container's status through the manager's view.
func (k kubelet) status(id string) *runtimeapi.ContainerStatus {
	var resp runtimeapi.ContainerStatusResponse
	k.callBytes(k.m.ContainerStatusBytes, &runtimeapi.ContainerStatusRequest{ContainerId: id}, &resp, func(ctx context.Context, b []byte) (proto.Message, error) {
		var r runtimeapi.ContainerStatusRequest
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		return k.rt.ContainerStatus(ctx, &r)
	})
	return resp.Status
}

// callBytes makes a call through one of the manager's encoded-message routes,
// as the proxy does, with the fake runtime behind it.
func (k kubelet) callBytes(fn func(context.Context, []byte, proxy.BytesNext) ([]byte, error), req, resp proto.Message,
	rt func(context.Context, []byte) (proto.Message, error)) {
	k.t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		k.t.Fatal(err)
	}
	out, err := fn(context.Background(), b, func(ctx context.Context, req []byte) ([]byte, error) {
		r, err := rt(ctx, req)
		if err != nil {
			return nil, err
		}
		return proto.Marshal(r)
	})
	if err != nil {
		k.t.Fatal(err)
	}
	if err := proto.Unmarshal(out, resp); err != nil {
		k.t.Fatal(err)
	}
}

// list lists containers through the manager's view.
func (k kubelet) list() map[string]runtimeapi.ContainerState {
	var resp runtimeapi.ListContainersResponse
	k.callBytes(k.m.ListContainersBytes, &runtimeapi.ListContainersRequest{}, &resp, func(ctx context.Context, b []byte) (proto.Message, error) {
		var r runtimeapi.ListContainersRequest
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		return k.rt.ListContainers(ctx, &r)
	})
	out := map[string]runtimeapi.ContainerState{}
	for _, c := range resp.Containers {
		out[c.Id] = c.State
	}
	return out
}

// testCurve is the tests' backoff curve: the real shape (doubling to a
// maximum), short enough that the executor's backoff wait, which runs on the
// wall clock as in the shim, is taken in every test that restarts.
var testCurve = backoff.Curve{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond}

func newTestManager(t *testing.T, rt *fakeRT, dir string) *Manager {
	t.Helper()
	m, err := New(rt, dir, backoff.NewTracker(testCurve, nil), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const rules88 = `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]`

// setup: init (ran to completion), sidecar and main running, main carries the rule.
func setup(t *testing.T, dir string) (kubelet, string, map[string]string) {
	rt := newFakeRT()
	rt.exitOnStart["init"] = 0
	k := kubelet{t: t, m: newTestManager(t, rt, dir), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": rules88})
	ids := map[string]string{}
	for _, n := range []string{"init", "sidecar", "main"} {
		ids[n] = k.start(sb, n)
	}
	return k, sb, ids
}

func TestTriggerViewsAndReplay(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	p := k.m.pods[sb]
	if len(p.Seq) != 3 || !p.Seq[0].WaitExit || p.Seq[1].WaitExit || p.Seq[2].WaitExit {
		t.Fatalf("start order %+v: want init (wait for exit), sidecar, main", p.Seq)
	}
	// main exits 88: the kubelet's first look already shows it running, and the restart begins.
	k.rt.exit(ids["main"], 88)
	if s := k.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || s.ExitCode != 0 || s.FinishedAt != 0 {
		t.Fatalf("triggering exit shown to the kubelet: %+v", s)
	}
	if p.Phase != PhaseTerminating {
		t.Fatalf("phase %s", p.Phase)
	}
	// The completed init container is shown as it is (a terminated init
	// container shown running is an illegal transition for the kubelet).
	if st := k.list(); st[ids["init"]] != runtimeapi.ContainerState_CONTAINER_EXITED || st[ids["sidecar"]] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("view during termination: %v", st)
	}
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if p.Phase != PhaseRunning || p.Restarts != 1 {
		t.Fatalf("after the restart: phase %s restarts %d (%s)", p.Phase, p.Restarts, p.LastError)
	}
	if got := fmt.Sprint(k.rt.created[3:]); got != "[init sidecar main]" {
		t.Fatalf("replayed %s, want init, sidecar, main in order", got)
	}
	if len(k.rt.stopped) != 1 || k.rt.stopped[0] != ids["sidecar"] {
		t.Fatalf("stopped %v, want only the running sidecar", k.rt.stopped)
	}
	// New instances carry the next restart count and log file; the old main shows its real exit.
	st := k.list()
	if st[ids["main"]] != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old main after the swap: %v", st[ids["main"]])
	}
	for id, s := range k.rt.cs {
		if _, old := map[string]bool{ids["init"]: true, ids["sidecar"]: true, ids["main"]: true}[id]; old {
			continue
		}
		if s.Annotations[annotationRestartCount] != "1" || s.LogPath != s.Metadata.Name+"/1.log" || s.Metadata.Attempt != 1 {
			t.Errorf("new %s: restartCount %q log %q attempt %d", s.Metadata.Name, s.Annotations[annotationRestartCount], s.LogPath, s.Metadata.Attempt)
		}
		want := runtimeapi.ContainerState_CONTAINER_RUNNING
		if s.Metadata.Name == "init" {
			want = runtimeapi.ContainerState_CONTAINER_EXITED
		}
		if st[id] != want {
			t.Errorf("new %s shown %v, want %v", s.Metadata.Name, st[id], want)
		}
	}
	// The old trigger must not trigger again; a new exit 88 does.
	if again, _ := k.m.classify(k.status(ids["main"])); again {
		t.Fatal("the old triggering exit triggered a second restart")
	}
	newMain := p.Latest["main"]
	k.rt.exit(newMain, 88)
	k.status(newMain)
	if p.Phase != PhaseTerminating {
		t.Fatalf("second trigger: phase %s", p.Phase)
	}
}

func TestNonMatchingExitIsShownAsIs(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.exit(ids["main"], 1)
	if s := k.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 {
		t.Fatalf("non-matching exit changed: %+v", s)
	}
	if p := k.m.pods[sb]; p.Phase != PhaseRunning || p.Trigger != nil {
		t.Fatalf("non-matching exit started a restart: %+v", p)
	}
}

func TestInitFailingDuringReplayIsHandedBack(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.exitOnStart["init"] = 1
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(k.rt.created[3:]); got != "[init]" {
		t.Fatalf("replayed %s after init failed; want only init", got)
	}
	if p := k.m.pods[sb]; p.Phase != PhaseRunning {
		t.Fatalf("phase %s", p.Phase)
	}
	// The failed init instance is visible: the kubelet applies the pod's restartPolicy.
	for id, s := range k.list() {
		if k.rt.cs[id].Metadata.Name == "init" && id != ids["init"] && s != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("failed init shown as %v", s)
		}
	}
}

// A shim killed mid-restart resumes from its state directory.
func TestResumeAfterCrash(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	// "kill -9": a new manager over the same state directory and runtime.
	m2 := newTestManager(t, k.rt, dir)
	p := m2.pods[sb]
	if p == nil || p.Phase != PhaseTerminating || p.Trigger.ContainerID != ids["main"] {
		t.Fatalf("state after restart of the shim: %+v", p)
	}
	if s, _ := m2.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]}); s.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatal("test setup")
	}
	k2 := kubelet{t: t, m: m2, rt: k.rt}
	if s := k2.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("resumed shim shows the trigger as %v", s.State)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m2.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m2.mu.Lock()
		ph := p.Phase
		m2.mu.Unlock()
		if ph == PhaseRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restart did not complete after resume: %s %s", ph, p.LastError)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	if n := len(k.rt.created); n != 6 {
		t.Fatalf("%d creates, want 3 + 3 (no duplicate restart)", n)
	}
}

func TestStopPodSandboxAbandonsRestart(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	_, err := k.m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			return &runtimeapi.StopPodSandboxResponse{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if s := k.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 88 {
		t.Fatalf("after StopPodSandbox the real exit must show: %+v", s)
	}
	if err := k.m.execute(context.Background(), sb); err != nil || len(k.rt.created) != 3 {
		t.Fatalf("abandoned restart still replayed: %v %v", k.rt.created, err)
	}
}

func TestUntrackedPodsAreNotTouched(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	k.runPod(map[string]string{RulesAnnotationPrefix + "main": "not json"})
	if k.m.Tracked() != 0 {
		t.Fatal("a pod whose only rules are malformed is tracked")
	}
	id := k.start("sb1", "main")
	rt.exit(id, 88)
	if s := k.status(id); s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("untracked pod's exit changed: %v", s.State)
	}
}

func TestReconcileDropsGoneSandboxes(t *testing.T) {
	dir := t.TempDir()
	k, sb, _ := setup(t, dir)
	k.m.reconcile(context.Background())
	if k.m.Tracked() != 1 {
		t.Fatal("a live sandbox was dropped")
	}
	k.rt.sandboxGone = true
	k.m.reconcile(context.Background())
	if k.m.Tracked() != 0 || k.m.pods[sb] != nil {
		t.Fatal("state of a removed sandbox kept")
	}
	if pods, _ := ReadPods(dir); len(pods) != 0 {
		t.Fatalf("state files left: %v", pods)
	}
}

// The event stream must not tell the kubelet about a triggering exit or about
// old instances while a restart is in progress.
func TestEventsOfRestartingPodAreDropped(t *testing.T) {
	k, _, ids := setup(t, t.TempDir())
	k.rt.exit(ids["main"], 88)
	st, _ := k.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]})
	ev := &runtimeapi.ContainerEventResponse{ContainerId: ids["main"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{st.Status}}
	if !k.m.dropEvent(ev) {
		t.Fatal("the triggering exit's event was relayed")
	}
	k.rt.exit(ids["sidecar"], 137)
	st, _ = k.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["sidecar"]})
	if !k.m.dropEvent(&runtimeapi.ContainerEventResponse{ContainerId: ids["sidecar"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{st.Status}}) {
		t.Fatal("an old instance's stop event was relayed during the restart")
	}
	if k.m.dropEvent(&runtimeapi.ContainerEventResponse{ContainerId: "unrelated", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}) {
		t.Fatal("an unrelated event was dropped")
	}
}

// A shim killed after the runtime created a replayed container but before the
// state recorded it adopts that container instead of creating a second one.
func TestInterruptedReplayCreateIsAdopted(t *testing.T) {
	// started: the shim died after it had also started the instance (its
	// log file exists, so a recomputed restart count would be one higher);
	// it must still be adopted by the saved intent, not created again.
	for _, started := range []bool{false, true} {
		t.Run(fmt.Sprintf("started=%v", started), func(t *testing.T) {
			dir := t.TempDir()
			k, sb, ids := setup(t, dir)
			k.rt.exit(ids["main"], 88)
			k.status(ids["main"])
			p := k.m.pods[sb]
			// Simulate: the executor recorded its intent for init/1, the runtime created it, then the shim died.
			p.LogDirectory = t.TempDir()
			p.Phase, p.Creating = PhaseStartup, "init/1"
			k.m.save(p)
			orphan, _ := k.rt.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "init", Attempt: 1}}})
			if started {
				if _, err := k.rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: orphan.ContainerId}); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Join(p.LogDirectory, "init"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p.LogDirectory, "init", "1.log"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m2 := newTestManager(t, k.rt, dir)
			if err := m2.execute(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			inits := 0
			for _, n := range k.rt.created {
				if n == "init" {
					inits++
				}
			}
			if inits != 2 {
				t.Fatalf("init created %d times, want 2 (original + adopted orphan %s)", inits, orphan.ContainerId)
			}
			if got := m2.pods[sb].Latest["init"]; got != orphan.ContainerId || m2.pods[sb].Phase != PhaseRunning {
				t.Fatalf("latest init %s, phase %s; want the adopted %s, Running", got, m2.pods[sb].Phase, orphan.ContainerId)
			}
		})
	}
}

// The shim died during StartContainer of a replayed container; the runtime
// cancelled the start (exited, never started). The resumed shim creates it
// once more instead of reporting a failed init container.
func TestInterruptedReplayStartIsRetried(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.rt.exit(ids["main"], 88)
	k.status(ids["main"])
	p := k.m.pods[sb]
	p.Phase = PhaseStartup
	resp, _ := k.rt.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "init", Attempt: 1}}})
	k.rt.exit(resp.ContainerId, 128) // StartError: StartedAt stays 0
	p.New = map[string]string{resp.ContainerId: "init"}
	p.IDs[resp.ContainerId] = "init"
	k.m.save(p)
	m2 := newTestManager(t, k.rt, dir)
	if err := m2.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(k.rt.created[4:]); got != "[init sidecar main]" {
		t.Fatalf("after an interrupted start the replay created %s, want init again then sidecar and main", got)
	}
	if _, still := k.rt.cs[resp.ContainerId]; still {
		t.Fatal("the interrupted instance was left for the kubelet to see")
	}
}

// A Restart rule restarts only its container, on its own backoff curve; the
// other containers keep running and the kubelet never sees the exit.
func TestRestartRuleRestartsOneContainer(t *testing.T) {
	rt := newFakeRT()
	rt.exitOnStart["init"] = 0
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	ids := map[string]string{}
	for _, n := range []string{"init", "sidecar", "main"} {
		ids[n] = k.start(sb, n)
	}
	p := k.m.pods[sb]
	for i, wantDelay := range []time.Duration{testCurve.Delay(1), testCurve.Delay(2), testCurve.Delay(3)} {
		cur := p.Latest["main"]
		exited := time.Now()
		k.rt.exit(cur, 1)
		if s := k.status(cur); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("restart %d: the kubelet saw the exit: %v", i+1, s.State)
		}
		if p.Scope != "main" || p.Trigger.Delay != wantDelay {
			t.Fatalf("restart %d: scope %q delay %s, want main and %s", i+1, p.Scope, p.Trigger.Delay, wantDelay)
		}
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		// The executor waited out the delay, counted from the exit.
		if took := time.Since(exited); took < wantDelay {
			t.Fatalf("restart %d: replayed %s after the exit, before its backoff delay %s", i+1, took, wantDelay)
		}
		if p.Phase != PhaseRunning || p.ContainerRestarts["main"] != i+1 || p.Restarts != 0 {
			t.Fatalf("restart %d: phase %s, container restarts %v, pod restarts %d", i+1, p.Phase, p.ContainerRestarts, p.Restarts)
		}
	}
	if got := fmt.Sprint(rt.created[3:]); got != "[main main main]" {
		t.Fatalf("replayed %s, want only main, three times", got)
	}
	if len(rt.stopped) != 0 {
		t.Fatalf("stopped %v: a Restart rule must not touch other containers", rt.stopped)
	}
	if s, _ := rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["sidecar"]}); s.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatal("sidecar disturbed")
	}
	if a := rt.cs[p.Latest["main"]].Metadata.Attempt; a != 3 {
		t.Fatalf("third restart has attempt %d, want 3", a)
	}
}

// A container that crashes again at once is classified in the swap itself:
// the kubelet never sees the new instance's exit, even for an instant.
func TestInstantCrashAfterSwapIsClassifiedAtOnce(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	id := k.start(sb, "main")
	rt.exitOnStart["main"] = 1 // every replayed instance exits as soon as it starts
	rt.exit(id, 1)
	k.status(id)
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods[sb]
	newID := p.Latest["main"]
	if newID == id || p.Phase != PhaseTerminating || p.Trigger.ContainerID != newID {
		t.Fatalf("after the swap: phase %s, trigger %+v, latest %s", p.Phase, p.Trigger, newID)
	}
	if st := k.list()[newID]; st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the new instance's instant exit is visible to the kubelet: %v", st)
	}
	if p.Trigger.Delay != testCurve.Delay(2) {
		t.Fatalf("second restart delay %s, want %s", p.Trigger.Delay, testCurve.Delay(2))
	}
}

// The kubelet reads pods as one full ListContainers and then, seconds later
// under load, the status of each listed container, with other lists in
// between. A swap between the two must not show it the old instance exited
// without the new one: an instance the last full list showed running, and
// replaced by the swap, reads running until the next full list.
func TestStatusAfterSwapHoldsTheListedPicture(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	old := k.start(sb, "main")
	// The kubelet's PLEG relist: one unfiltered list, then the statuses.
	listPod := k.list
	k.rt.exit(old, 1)
	if got := listPod(); len(got) != 1 || got[old] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list during the restart: %v, want only the old instance, running", got)
	}
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	// Another caller's list of running containers only (the kubelet's
	// GetPods(false)) does not show the old instance either way.
	if _, err := k.m.listContainers(context.Background(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}},
		func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			return k.rt.ListContainers(ctx, r)
		}); err != nil {
		t.Fatal(err)
	}
	if s := k.status(old); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("status after the swap, before a new list: %v, want running as listed", s.State)
	}
	got := listPod()
	nw := k.m.pods[sb].Latest["main"]
	if got[old] != runtimeapi.ContainerState_CONTAINER_EXITED || got[nw] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod list after the swap: %v, want old exited and new %s running", got, nw)
	}
	if s := k.status(old); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 {
		t.Fatalf("status after the next full list: %v/%d, want exited 1", s.State, s.ExitCode)
	}

	// Again, with the new instance crashing at once: the swap starts the
	// next restart right away, and the instance the kubelet listed last
	// must still read running.
	k.rt.exitOnStart["main"] = 1
	listPod()
	k.rt.exit(nw, 1)
	k.status(nw)
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if p := k.m.pods[sb]; p.Phase != PhaseTerminating || p.Trigger.ContainerID == nw {
		t.Fatalf("phase %s: the instantly crashed instance should be the next trigger", p.Phase)
	}
	if s := k.status(nw); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("listed instance after an instant re-crash: %v, want running as listed", s.State)
	}
}

// A container the kubelet stops itself, or any exit after the kubelet stopped
// the sandbox, is the kubelet's decision: no rule restarts it (a restart there
// would leave a running container behind a finished KillPod).
func TestKubeletStopsAreNotRestarted(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`,
		RulesAnnotationPrefix + "side": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	main, side := k.start(sb, "main"), k.start(sb, "side")
	if _, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: main},
		func(ctx context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
			k.rt.exit(r.ContainerId, 137)
			return &runtimeapi.StopContainerResponse{}, nil
		}); err != nil {
		t.Fatal(err)
	}
	if s := k.status(main); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 137 || k.m.pods[sb].Phase != PhaseRunning {
		t.Fatalf("kubelet-stopped container: %v/%d, phase %s; want its real exit and no restart", s.State, s.ExitCode, k.m.pods[sb].Phase)
	}
	if _, err := k.m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			return &runtimeapi.StopPodSandboxResponse{}, nil
		}); err != nil {
		t.Fatal(err)
	}
	k.rt.exit(side, 1)
	if s := k.status(side); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || k.m.pods[sb].Phase != PhaseRunning {
		t.Fatalf("exit after StopPodSandbox: %v, phase %s; want its real exit and no restart", s.State, k.m.pods[sb].Phase)
	}
	if len(rt.created) != 2 {
		t.Fatalf("created %v: nothing may be restarted", rt.created)
	}
}

// Restarts on command (the pod management channel): a pod without rules,
// tracked because TrackAlso says so, restarts one container and then the
// whole pod through the same machinery as the rules.
func TestRestartOnCommand(t *testing.T) {
	rt := newFakeRT()
	rt.exitOnStart["init"] = 0
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	ctx := context.Background()
	// Untracked: refused.
	sb := k.runPod(map[string]string{"orchestrated": "yes"})
	if err := k.m.RestartPod(ctx, sb, "x"); err == nil {
		t.Fatal("an untracked pod was restarted")
	}
	k.m.TrackAlso(func(a map[string]string) bool { return a["orchestrated"] == "yes" })
	sb = k.runPod(map[string]string{"orchestrated": "yes"})
	for _, n := range []string{"init", "sidecar", "main"} {
		k.start(sb, n)
	}
	p := k.m.pods[sb]
	if err := k.m.RestartContainer(ctx, sb, "nope", "x"); err == nil {
		t.Fatal("restart of an unknown container accepted")
	}
	main := p.Latest["main"]
	if err := k.m.RestartContainer(ctx, sb, "main", "test"); err != nil {
		t.Fatal(err)
	}
	if s := k.status(main); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || p.Scope != "main" {
		t.Fatalf("after the command: kubelet sees %v, scope %q; want the restart under way", s.State, p.Scope)
	}
	if err := k.m.RestartPod(ctx, sb, "busy"); err == nil {
		t.Fatal("a second restart accepted while one is in progress")
	}
	if err := k.m.execute(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.ContainerRestarts["main"] != 1 || p.Restarts != 0 || len(p.Forced) != 0 {
		t.Fatalf("container restarts %v, pod restarts %d, forced %v", p.ContainerRestarts, p.Restarts, p.Forced)
	}
	if err := k.m.RestartPod(ctx, sb, "job restart"); err != nil {
		t.Fatal(err)
	}
	stopped := rt.stopped[len(rt.stopped)-1]
	if s := k.status(stopped); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || p.Scope != "" {
		t.Fatalf("after RestartPod: kubelet sees %v, scope %q; want a pod restart under way", s.State, p.Scope)
	}
	if err := k.m.execute(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.Restarts != 1 || p.Phase != PhaseRunning {
		t.Fatalf("pod restarts %d, phase %s", p.Restarts, p.Phase)
	}
}

// The PLEG's relist (a full container list right after a full sandbox list)
// is told from the stats provider's (a full container list with no sandbox
// list before it); a kubelet that never lists sandboxes has every full list
// taken as a relist.
func TestRelistToldFromStatsList(t *testing.T) {
	k, _, _ := setup(t, t.TempDir())
	m := k.m
	if !m.isRelist() {
		t.Fatal("no sandbox list ever seen: a full list must count as the relist")
	}
	m.sawSandboxList(2)
	if !m.isRelist() {
		t.Fatal("container list right after the sandbox list: not taken as the relist")
	}
	if m.isRelist() {
		t.Fatal("a second full list (the stats provider's) taken as a relist")
	}
	m.sawSandboxList(40) // a filtered sandbox list
	if m.isRelist() {
		t.Fatal("a filtered sandbox list made the next container list a relist")
	}
	m.sawSandboxList(0)
	m.sandboxListAt.Store(time.Now().Add(-time.Second).UnixNano())
	if m.isRelist() {
		t.Fatal("a container list a second after the sandbox list taken as the relist")
	}
}

// An exit delivered by the shim's event feed starts the restart before any
// kubelet call; events of other types or other containers change nothing.
func TestExitSeenThroughEventFeed(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	feed := func(id string, typ runtimeapi.ContainerEventType) { k.event(sb, id, typ) }
	k.rt.exit(ids["main"], 88)
	feed(ids["main"], runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	feed("unrelated", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.mu.Lock()
	ph := k.m.pods[sb].Phase
	k.m.mu.Unlock()
	if ph != PhaseRunning {
		t.Fatalf("phase %s after events that are not this pod's exit", ph)
	}
	feed(ids["main"], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.mu.Lock()
	p := k.m.pods[sb]
	ph, trig := p.Phase, p.Trigger
	k.m.mu.Unlock()
	if ph != PhaseTerminating || trig == nil || trig.ContainerID != ids["main"] || trig.ExitCode != 88 {
		t.Fatalf("after the exit event: phase %s trigger %+v", ph, trig)
	}
}

// event hands the manager a container event as the runtime sends it: with
// the container's status, if the runtime still has it.
func (k kubelet) event(sb, id string, typ runtimeapi.ContainerEventType) {
	k.t.Helper()
	st, err := k.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	var statuses []*runtimeapi.ContainerStatus
	if err == nil {
		statuses = append(statuses, st.Status)
	}
	b, err := proto.Marshal(&runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ,
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: sb}, ContainersStatuses: statuses})
	if err != nil {
		k.t.Fatal(err)
	}
	e, err := events.Parse(b)
	if err != nil {
		k.t.Fatal(err)
	}
	k.m.OnEvent(e)
}

// remove deletes a container as the kubelet's container GC does, through the manager.
func (k kubelet) remove(id string) {
	_, err := k.m.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id},
		func(ctx context.Context, r *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
			return k.rt.RemoveContainer(ctx, r)
		})
	if err != nil {
		k.t.Fatal(err)
	}
}

// A crash-looping container's record stays the size of its live instances:
// instances the kubelet removes are forgotten (they were kept for ever, and
// the record is written at every restart step).
func TestCrashLoopRecordStaysBounded(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	for i := range 30 {
		cur := p.Latest["main"]
		k.rt.exit(cur, 1)
		k.status(cur)
		if i%2 == 1 {
			// Removed while the next restart is pending: the trigger is kept.
			k.remove(cur)
			if _, ok := p.IDs[cur]; !ok {
				t.Fatalf("restart %d: the trigger of the restart in progress was forgotten", i+1)
			}
		}
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		k.remove(cur) // the kubelet's GC removes the previous instance
	}
	if n := len(p.IDs) + len(p.Dead) + len(p.Settled) + len(p.Old); n > 6 {
		t.Fatalf("after 30 restarts the record holds %d ids, %d dead, %d settled, %d old", len(p.IDs), len(p.Dead), len(p.Settled), len(p.Old))
	}
	if p.ContainerRestarts["main"] != 30 || p.Phase != PhaseRunning {
		t.Fatalf("restarts %d phase %s", p.ContainerRestarts["main"], p.Phase)
	}
	if len(k.m.byID) != len(p.IDs) {
		t.Fatalf("byID %d entries, pod %d", len(k.m.byID), len(p.IDs))
	}
}

// Instances removed behind the shim's back are pruned by reconcile even while
// the pod is restarting (a crash-looping pod is hardly ever Running).
func TestReconcilePrunesDuringRestart(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	rt := k.rt
	var gone []string
	for range 5 {
		cur := p.Latest["main"]
		k.rt.exit(cur, 1)
		k.status(cur)
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, cur)
	}
	trigger := p.Latest["main"]
	k.rt.exit(trigger, 1)
	k.status(trigger)
	if p.Phase == PhaseRunning {
		t.Fatal("test setup: the pod should be restarting")
	}
	for _, id := range append(gone, trigger) {
		_, _ = rt.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id})
	}
	k.m.reconcile(context.Background())
	for _, id := range gone {
		if _, ok := p.IDs[id]; ok {
			t.Fatalf("removed instance %s still recorded", id)
		}
	}
	if _, ok := p.IDs[trigger]; !ok {
		t.Fatal("the trigger of the restart in progress was pruned")
	}
}

// A sandbox stopped behind the shim's back: the failed start ends the
// restart for good instead of being retried (and the container is not
// removed: containerd 2.2.1 panics removing one whose sandbox is gone).
func TestRestartAbandonedWhenSandboxDies(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	rt := k.rt
	cur := p.Latest["main"]
	k.rt.exit(cur, 1)
	k.status(cur)
	// A step failing while the sandbox is ready is retried, not abandoned.
	if k.m.abandonIfSandboxGone(context.Background(), sb, fmt.Errorf("transient")) || p.Stopped {
		t.Fatal("abandoned with a ready sandbox")
	}
	rt.mu.Lock()
	rt.sandboxDead = true
	rt.mu.Unlock()
	err := k.m.execute(context.Background(), sb)
	if err == nil {
		t.Fatal("the start in a dead sandbox succeeded")
	}
	if !k.m.abandonIfSandboxGone(context.Background(), sb, err) {
		t.Fatal("restart not abandoned although the sandbox is not ready")
	}
	if p.Phase != PhaseRunning || !p.Stopped {
		t.Fatalf("phase %s stopped %v", p.Phase, p.Stopped)
	}
	// A later step does nothing, and nothing was removed.
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if len(rt.removed) != 0 {
		t.Fatalf("removed %v", rt.removed)
	}
}

// crashingMainPod runs a pod whose one container, main, has a Restart rule
// for every failure, and starts main.
func crashingMainPod(t *testing.T) (kubelet, string, *Pod) {
	t.Helper()
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	k.start(sb, "main")
	return k, sb, k.m.pods[sb]
}

// Replays reuse the decoded CreateContainer request: attempts stay
// consecutive, a failed create does not skip one, and a container the
// kubelet creates again is replayed from its new request.
func TestReplayRequestReuse(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	restart := func() string {
		t.Helper()
		cur := p.Latest["main"]
		k.rt.exit(cur, 1)
		k.status(cur)
		if err := k.m.execute(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		return p.Latest["main"]
	}
	attempt := func(id string) uint32 {
		k.rt.mu.Lock()
		defer k.rt.mu.Unlock()
		return k.rt.cs[id].Metadata.Attempt
	}
	for want := uint32(1); want <= 3; want++ {
		if a := attempt(restart()); a != want {
			t.Fatalf("restart %d: attempt %d", want, a)
		}
	}
	// A failed create, then the retry: attempt 4, not 5.
	cur := p.Latest["main"]
	k.rt.exit(cur, 1)
	k.status(cur)
	k.rt.mu.Lock()
	k.rt.failCreates = 1
	k.rt.mu.Unlock()
	if err := k.m.execute(context.Background(), sb); err == nil {
		t.Fatal("the failing create succeeded")
	}
	if err := k.m.execute(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if a := attempt(p.Latest["main"]); a != 4 {
		t.Fatalf("after a failed create: attempt %d, want 4", a)
	}
	// The kubelet creates main again with another log path: the next replay
	// starts from that request.
	k.rt.exit(p.Latest["main"], 0)
	req := &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: "main", Attempt: 9},
		Annotations: map[string]string{annotationRestartCount: "9", annotationGracePeriod: "0"},
		LogPath:     "main/9.log", Command: []string{"new"},
	}}
	resp, err := k.m.CreateContainer(context.Background(), req, func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		return k.rt.CreateContainer(ctx, r)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	next := restart()
	k.rt.mu.Lock()
	logPath := k.rt.logPaths[next]
	k.rt.mu.Unlock()
	if a := attempt(next); a != 10 || logPath != "main/10.log" {
		t.Fatalf("after the kubelet's create: attempt %d log %q, want 10 and main/10.log", a, logPath)
	}
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
