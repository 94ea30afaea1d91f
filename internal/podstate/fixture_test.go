package podstate

// The test fixture: the kubelet's part, played through the manager's route
// functions, and a manager, over the shared fake runtime (internal/
// fakeruntime), which answers as containerd does.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/restartview"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// kubelet plays the kubelet's part through the manager's route functions.
type kubelet struct {
	t *testing.T
	m *Manager
	// rt is the runtime, to steer and to read its records; cri is a client
	// of it, as the shim's.
	rt  *fakeruntime.Runtime
	cri runtimeapi.RuntimeServiceClient
	// logDir is the pod's log directory.
	logDir string
}

// newKubelet starts a runtime and a manager over it whose state is in dir.
func newKubelet(t *testing.T, dir string) kubelet {
	t.Helper()
	return newKubeletLogged(t, dir, nil)
}

// newKubeletLogged is newKubelet with the manager logging to log (nil:
// nowhere).
func newKubeletLogged(t *testing.T, dir string, log *slog.Logger) kubelet {
	t.Helper()
	rt := fakeruntime.Start(t)
	k := kubelet{t: t, rt: rt, cri: rt.Client(), logDir: t.TempDir()}
	if log == nil {
		k.m = newTestManager(t, k.cri, dir)
	} else {
		k.m = newLoggedManager(t, k.cri, dir, log)
	}
	return k
}

// restarted is k with the manager of a new shim process over dir and the
// same runtime, as after a "kill -9" of the shim.
func (k kubelet) restarted(dir string) kubelet {
	k.m = newTestManager(k.t, k.cri, dir)
	return k
}

func newTestManager(t *testing.T, rt runtimeService, dir string) *Manager {
	t.Helper()
	return newLoggedManager(t, rt, dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// newLoggedManager is newTestManager logging to log.
func newLoggedManager(t *testing.T, rt runtimeService, dir string, log *slog.Logger) *Manager {
	t.Helper()
	// This kubelet removes no container unless a test says so (k.remove):
	// restarts do not wait for removals (backlog_test.go covers them).
	m, err := New(rt, dir, backoff.NewTracker(testCurve, nil), log, Options{KeepDead: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fwd is a runtime client's call as the next step of a route: the call
// forwarded to the runtime.
func fwd[Req, Resp any](call func(context.Context, *Req, ...grpc.CallOption) (*Resp, error)) func(context.Context, *Req) (*Resp, error) {
	return func(ctx context.Context, req *Req) (*Resp, error) { return call(ctx, req) }
}

// podConfig is the sandbox configuration of pod uid-1, with the next
// sandbox attempt: the runtime refuses a name and attempt it holds.
func (k kubelet) podConfig(annotations map[string]string) *runtimeapi.PodSandboxConfig {
	k.t.Helper()
	resp, err := k.cri.ListPodSandbox(context.Background(), &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		k.t.Fatal(err)
	}
	attempt := uint32(0)
	for _, sb := range resp.Items {
		if a := sb.GetMetadata().GetAttempt(); sb.GetMetadata().GetUid() == "uid-1" && a >= attempt {
			attempt = a + 1
		}
	}
	return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-1", Attempt: attempt},
		Annotations: annotations, LogDirectory: k.logDir}
}

// runPod runs a sandbox of pod uid-1 and returns its ID: sb1, then sb2...
func (k kubelet) runPod(annotations map[string]string) string {
	k.t.Helper()
	sb := fmt.Sprintf("sb%d", k.rt.Calls("RunPodSandbox")+1)
	k.runSandbox(sb, annotations)
	return sb
}

// admissions is the pod table's admission with the manager alone.
func (k kubelet) admissions() podtable.Admissions {
	return podtable.Admissions{Features: []podtable.Admitter{k.m}, RT: k.cri, Log: k.m.log}
}

// runSandbox is RunPodSandbox of pod uid-1 answered with sandbox ID sb, as
// when the kubelet creates a pod's sandbox (again).
func (k kubelet) runSandbox(sb string, annotations map[string]string) {
	k.t.Helper()
	k.rt.NextIDs(sb)
	if _, err := k.admissions().Run(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: k.podConfig(annotations)},
		fwd(k.cri.RunPodSandbox)); err != nil {
		k.t.Fatal(err)
	}
}

// removeSandbox is the kubelet's RemovePodSandbox of sb: the runtime
// removes it, and the pod table announces it gone (SandboxGone).
func (k kubelet) removeSandbox(sb string) {
	k.t.Helper()
	if _, err := k.cri.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb}); err != nil {
		k.t.Fatal(err)
	}
	k.m.SandboxGone(sb)
}

// createReq is the kubelet's CreateContainer of container name in sandbox
// sb with restart count attempt.
// testImage is an image the fake runtime holds, as a test node does.
var testImage = fakeruntime.NodeImages[1]

func (k kubelet) createReq(sb, name string, attempt uint32) *runtimeapi.CreateContainerRequest {
	n := strconv.FormatUint(uint64(attempt), 10)
	return &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		Image:       &runtimeapi.ImageSpec{Image: testImage},
		Labels:      map[string]string{podUIDLabel: "uid-1"},
		Annotations: map[string]string{annotationRestartCount: n, annotationGracePeriod: "0"},
		LogPath:     name + "/" + n + ".log",
	}, SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-1"},
		LogDirectory: k.logDir}}
}

// start creates and starts a container as the kubelet does: restart count
// 0, or one more than the pod's last instance of name the runtime holds (a
// container of the pod's previous sandbox).
func (k kubelet) start(sb, name string) string {
	k.t.Helper()
	ctx := context.Background()
	list, err := k.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		k.t.Fatal(err)
	}
	attempt := uint32(0)
	for _, c := range list.Containers {
		if a := c.GetMetadata().GetAttempt(); c.GetMetadata().GetName() == name && a >= attempt {
			attempt = a + 1
		}
	}
	resp, err := k.m.CreateContainer(ctx, k.createReq(sb, name, attempt), fwd(k.cri.CreateContainer))
	if err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.cri.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		k.t.Fatal(err)
	}
	return resp.ContainerId
}

// exit makes container id's process exit with code.
func (k kubelet) exit(id string, code int32) {
	k.t.Helper()
	if err := k.rt.Exit(id, code); err != nil {
		k.t.Fatal(err)
	}
}

// container is the runtime's status of container id.
func (k kubelet) container(id string) *runtimeapi.ContainerStatus {
	k.t.Helper()
	s, _, ok := k.rt.Container(id)
	if !ok {
		k.t.Fatalf("the runtime has no container %s", id)
	}
	return s
}

// created are the names of the containers the runtime was asked to create,
// in order.
func (k kubelet) created() []string {
	var names []string
	for _, r := range k.rt.Requests("CreateContainer") {
		names = append(names, r.(*runtimeapi.CreateContainerRequest).GetConfig().GetMetadata().GetName())
	}
	return names
}

// stopped are the IDs of the containers the runtime was asked to stop, in order.
func (k kubelet) stopped() []string {
	var ids []string
	for _, r := range k.rt.Requests("StopContainer") {
		ids = append(ids, r.(*runtimeapi.StopContainerRequest).ContainerId)
	}
	return ids
}

// views are the kubelet's views of each manager's pods, as the shim's
// restartview takes part in the kubelet's reads.
var views sync.Map // *Manager -> *restartview.View

// view is the restartview of k.m.
func (k kubelet) view() *restartview.View {
	if v, ok := views.Load(k.m); ok {
		return v.(*restartview.View)
	}
	m := k.m
	v := restartview.New(k.m, func() uint64 { return m.opts.EventsLive() }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	got, _ := views.LoadOrStore(k.m, v)
	return got.(*restartview.View)
}

// status reads a container's status through the kubelet's view.
func (k kubelet) status(id string) *runtimeapi.ContainerStatus {
	var resp runtimeapi.ContainerStatusResponse
	k.callBytes(k.view().ContainerStatusBytes, &runtimeapi.ContainerStatusRequest{ContainerId: id}, &resp, func(ctx context.Context, b []byte) (proto.Message, error) {
		var r runtimeapi.ContainerStatusRequest
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		return k.cri.ContainerStatus(ctx, &r)
	})
	return resp.Status
}

// callBytes makes a call through one of the manager's encoded-message routes,
// as the proxy does, with the runtime behind it.
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

// list lists containers through the manager's view, as the kubelet's global
// relist does (no filter).
func (k kubelet) list() map[string]runtimeapi.ContainerState {
	k.checkQuiet()
	return k.listWith(&runtimeapi.ListContainersRequest{})
}

// checkQuiet fails the test if the set of quiet instances the next list
// would use (Records.Quiet, made when something changed) holds one that is
// not quiet by now: an edit took it out without the set being made again.
func (k kubelet) checkQuiet() {
	k.t.Helper()
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	inUse := k.m.pods.Quiet()
	k.m.pods.Recheck()
	now := k.m.pods.Quiet()
	for _, p := range k.m.pods.All() {
		for id := range p.Instances {
			if h := wire.IDHead([]byte(id)); inUse.Has(h) && !now.Has(h) {
				k.t.Errorf("instance %s of pod %s (phase %s) is in the quiet set a list would use, and no longer quiet: %+v", id, p.Name, p.Phase, *p.Instances[id])
			}
		}
	}
}

// listWith lists containers with req through the manager's view.
func (k kubelet) listWith(req *runtimeapi.ListContainersRequest) map[string]runtimeapi.ContainerState {
	var resp runtimeapi.ListContainersResponse
	k.callBytes(k.view().ListContainersBytes, req, &resp, func(ctx context.Context, b []byte) (proto.Message, error) {
		var r runtimeapi.ListContainersRequest
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		return k.cri.ListContainers(ctx, &r)
	})
	out := map[string]runtimeapi.ContainerState{}
	for _, c := range resp.Containers {
		out[c.Id] = c.State
	}
	return out
}

// podUIDLabel is the label the kubelet puts on every container of a pod
// (kuberuntime labels.go) and lists one pod's containers by.
const podUIDLabel = "io.kubernetes.pod.uid"

// listPod lists one pod's containers as the kubelet's relist of a single pod
// does (kuberuntime GetPod: a label-filtered ListContainers).
func (k kubelet) listPod(uid string) map[string]runtimeapi.ContainerState {
	return k.listWith(&runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{LabelSelector: map[string]string{podUIDLabel: uid}}})
}

// readPod reads a pod as the kubelet's PLEG does after a list: the sandbox's
// status, then the status of each of ids.
func (k kubelet) readPod(sb string, ids ...string) map[string]*runtimeapi.ContainerStatus {
	req, err := proto.Marshal(&runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	if err != nil {
		k.t.Fatal(err)
	}
	k.m.ObservePodSandboxStatus(req)
	out := map[string]*runtimeapi.ContainerStatus{}
	for _, id := range ids {
		out[id] = k.status(id)
	}
	return out
}

// event hands the manager a container event as the runtime sends it: with
// the container's status, if the runtime still has it.
func (k kubelet) event(sb, id string, typ runtimeapi.ContainerEventType) {
	k.t.Helper()
	st, err := k.cri.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
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
	k.view().OnEvent(e)
}

// remove deletes a container as the kubelet's container GC does, through
// the view and the manager, in the shim's order.
func (k kubelet) remove(id string) {
	if _, err := k.view().RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id},
		func(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
			return k.m.RemoveContainer(ctx, req, fwd(k.cri.RemoveContainer))
		}); err != nil {
		k.t.Fatal(err)
	}
}

// setup: init (ran to completion), sidecar and main running, main carries the rule.
func setup(t *testing.T, dir string) (kubelet, string, map[string]string) {
	return setupLogged(t, dir, nil)
}

// setupLogged is setup with the manager logging to log (nil: nowhere).
func setupLogged(t *testing.T, dir string, log *slog.Logger) (kubelet, string, map[string]string) {
	k := newKubeletLogged(t, dir, log)
	k.rt.ExitOnStart("init", 0)
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": rules88})
	ids := map[string]string{}
	for _, n := range []string{"init", "sidecar", "main"} {
		ids[n] = k.start(sb, n)
	}
	return k, sb, ids
}

// crashingMainPod runs a pod whose one container, main, has a Restart rule
// for every failure, and starts main.
func crashingMainPod(t *testing.T) (kubelet, string, *restartrecord.Pod) {
	t.Helper()
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
	k.start(sb, "main")
	return k, sb, k.m.pods.Get(sb)
}

// runSteps runs a sandbox's restart steps in this goroutine as the engine's
// queue does: a step that must wait runs again after its wait, or at once
// when a phase changes or an instance is forgotten (which queue it again in
// the engine: forget).
func runSteps(m *Manager, ctx context.Context, sandboxID string) error {
	for {
		m.mu.Lock()
		wake := m.phaseWait()
		m.mu.Unlock()
		after, err := m.step(ctx, sandboxID)
		if err != nil || after == 0 {
			return err
		}
		t := time.NewTimer(after)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}
