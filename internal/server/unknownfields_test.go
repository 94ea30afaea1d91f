package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// Tags of the unknown fields: what the kubelet sent, what the runtime did.
const (
	fromKubelet = "from-a-newer-kubelet"
	fromRuntime = "from-a-newer-runtime"
)

// streamRecorder is the fake runtime with the requests of its streams
// recorded (the fake records unary requests only).
type streamRecorder struct {
	*fakeruntime.Runtime
	mu      sync.Mutex
	events  []*runtimeapi.GetEventsRequest
	streams []*runtimeapi.StreamContainersRequest
}

func (s *streamRecorder) GetContainerEvents(req *runtimeapi.GetEventsRequest, ss grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	s.mu.Lock()
	s.events = append(s.events, proto.Clone(req).(*runtimeapi.GetEventsRequest))
	s.mu.Unlock()
	return s.Runtime.GetContainerEvents(req, ss)
}

func (s *streamRecorder) StreamContainers(req *runtimeapi.StreamContainersRequest, ss grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	s.mu.Lock()
	s.streams = append(s.streams, proto.Clone(req).(*runtimeapi.StreamContainersRequest))
	s.mu.Unlock()
	return s.Runtime.StreamContainers(req, ss)
}

// runtimeAnswersUnknown makes every answer of rt carry an unknown field, at
// its top and in each message it nests that the shim reads or edits.
func runtimeAnswersUnknown(rt *fakeruntime.Runtime) {
	top := func(m proto.Message) { fakeruntime.AddUnknown(m, fromRuntime) }
	for _, method := range []string{"RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "CreateContainer", "StartContainer",
		"StopContainer", "RemoveContainer"} {
		rt.Rewrite(method, top)
	}
	rt.Rewrite("ContainerStatus", func(m proto.Message) {
		top(m)
		top(m.(*runtimeapi.ContainerStatusResponse).Status)
	})
	rt.Rewrite("PodSandboxStatus", func(m proto.Message) {
		top(m)
		top(m.(*runtimeapi.PodSandboxStatusResponse).Status)
	})
	rt.Rewrite("ListContainers", func(m proto.Message) {
		top(m)
		for _, c := range m.(*runtimeapi.ListContainersResponse).Containers {
			top(c)
		}
	})
	rt.Rewrite("StreamContainers", func(m proto.Message) {
		top(m)
		for _, c := range m.(*runtimeapi.StreamContainersResponse).Containers {
			top(c)
		}
	})
	rt.Rewrite("GetContainerEvents", func(m proto.Message) {
		e := m.(*runtimeapi.ContainerEventResponse)
		top(e)
		for _, s := range e.ContainersStatuses {
			top(s)
		}
	})
}

// kubeletSends gives m (and the messages nested in it given) an unknown
// field from the kubelet.
func kubeletSends[M proto.Message](m M, nested ...proto.Message) M {
	fakeruntime.AddUnknown(m, fromKubelet)
	for _, n := range nested {
		fakeruntime.AddUnknown(n, fromKubelet)
	}
	return m
}

// CRI messages carrying fields this build's cri-api does not know (a newer
// kubelet's requests, a newer runtime's answers; cri-api v0.38.0-beta.0
// adds some) pass through every hook that decodes and re-encodes them
// unchanged: the shim as server.Run builds it, in front of a runtime that
// adds an unknown field to every answer, with every feature's hooks
// active (a pod with restart rules, an orchestrator channel and warm
// restarts), on the calls where a hook changes the request (the
// orchestrator's token mount) and where the restart view edits the answer
// (an exit held by the backoff, shown running in a status and a list).
func TestUnknownFieldsPassThroughEveryHook(t *testing.T) {
	rec := &streamRecorder{}
	rt := fakeruntime.Start(t, fakeruntime.WithRuntimeService(func(r *fakeruntime.Runtime) runtimeapi.RuntimeServiceServer {
		rec.Runtime = r
		return rec
	}))
	runtimeAnswersUnknown(rt)
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Runtime.Endpoint = rt.Sock
	// A hold that outlasts the test: the held exit is shown running.
	cfg.Backoff.InitialDelay = config.Duration{Duration: time.Minute}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Ready: func() { close(ready) }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("never ready")
	}
	cc, err := grpc.NewClient("unix://"+cfg.Server.Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	k := runtimeapi.NewRuntimeServiceClient(cc)
	c := ctxT(t)

	// mark is where the runtime's requests of method are now; arrived
	// checks that one of those it got since carries the kubelet's unknown
	// fields, at the top and in the nested messages pick gives (the shim
	// makes calls of its own too).
	mark := func(method string) int { return len(rt.Requests(method)) }
	arrived := func(method string, since int, pick func(proto.Message) []proto.Message) proto.Message {
		t.Helper()
		for _, r := range rt.Requests(method)[since:] {
			if !fakeruntime.HasUnknown(r, fromKubelet) {
				continue
			}
			if pick != nil {
				for i, m := range pick(r) {
					if !fakeruntime.HasUnknown(m, fromKubelet) {
						t.Errorf("%s: nested message %d (%T) reached the runtime without the kubelet's unknown field", method, i, m)
					}
				}
			}
			return r
		}
		t.Fatalf("%s: no request with the kubelet's unknown field reached the runtime", method)
		return nil
	}
	// answered checks the kubelet got the runtime's unknown fields.
	answered := func(what string, ms ...proto.Message) {
		t.Helper()
		for i, m := range ms {
			if !fakeruntime.HasUnknown(m, fromRuntime) {
				t.Errorf("%s: message %d (%T) reached the kubelet without the runtime's unknown field", what, i, m)
			}
		}
	}

	// unary makes one call of method, whose answer must carry the
	// runtime's unknown field and whose request reached the runtime with
	// the kubelet's.
	unary := func(method string, do func() (proto.Message, error)) {
		t.Helper()
		since := mark(method)
		resp, err := do()
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		answered(method, resp)
		arrived(method, since, nil)
	}

	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-1"}, LogDirectory: t.TempDir(),
		Annotations: map[string]string{
			podspec.RestartRulesPrefix + "main":  `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[3]}}]`,
			podspec.PodManagementPrefix + "orch": `{"port": 50051, "version": "1.0"}`,
			podspec.WarmRestartKey:               "true",
		}}
	run := &runtimeapi.RunPodSandboxRequest{Config: proto.Clone(sbCfg).(*runtimeapi.PodSandboxConfig)}
	m := mark("RunPodSandbox")
	sb, err := k.RunPodSandbox(c, kubeletSends(run, run.Config, run.Config.Metadata))
	if err != nil {
		t.Fatal(err)
	}
	answered("RunPodSandbox", sb)
	arrived("RunPodSandbox", m, func(m proto.Message) []proto.Message {
		r := m.(*runtimeapi.RunPodSandboxRequest)
		return []proto.Message{r.Config, r.Config.Metadata}
	})

	// The kubelet's event stream, through the restart view's relay.
	evs, err := k.GetContainerEvents(c, kubeletSends(&runtimeapi.GetEventsRequest{}))
	if err != nil {
		t.Fatal(err)
	}

	ids := map[string]string{}
	for _, name := range []string{"orch", "main"} {
		cfg := &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name},
			Image: &runtimeapi.ImageSpec{Image: fakeruntime.NodeImages[1]}, LogPath: name + "/0.log",
			Annotations: map[string]string{"io.kubernetes.container.restartCount": "0"}}
		req := kubeletSends(&runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: cfg,
			SandboxConfig: proto.Clone(sbCfg).(*runtimeapi.PodSandboxConfig)}, cfg, cfg.Metadata, cfg.Image)
		m := mark("CreateContainer")
		resp, err := k.CreateContainer(c, req)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		answered("CreateContainer "+name, resp)
		got := arrived("CreateContainer", m, func(m proto.Message) []proto.Message {
			r := m.(*runtimeapi.CreateContainerRequest)
			return []proto.Message{r.Config, r.Config.Metadata, r.Config.Image}
		}).(*runtimeapi.CreateContainerRequest)
		if name == "orch" && len(got.Config.Mounts) != 1 {
			t.Fatalf("the orchestrator's create reached the runtime with mounts %v: the channel's hook did not add its token", got.Config.Mounts)
		}
		ids[name] = resp.ContainerId
		unary("StartContainer", func() (proto.Message, error) {
			return k.StartContainer(c, kubeletSends(&runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}))
		})
	}
	for {
		e, err := evs.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e.ContainerId == ids["main"] && e.ContainerEventType == runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT {
			answered("the event of main's start", e)
			for _, s := range e.ContainersStatuses {
				answered("a status in the event", s)
			}
			break
		}
	}
	rec.mu.Lock()
	if len(rec.events) == 0 || !fakeruntime.HasUnknown(rec.events[len(rec.events)-1], fromKubelet) {
		t.Errorf("GetContainerEvents reached the runtime without the kubelet's unknown field (%d subscriptions)", len(rec.events))
	}
	rec.mu.Unlock()

	status := func(id string) *runtimeapi.ContainerStatusResponse {
		t.Helper()
		m := mark("ContainerStatus")
		r, err := k.ContainerStatus(c, kubeletSends(&runtimeapi.ContainerStatusRequest{ContainerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		answered("ContainerStatus", r, r.Status)
		arrived("ContainerStatus", m, nil)
		return r
	}
	lists := func(what string) map[string]runtimeapi.ContainerState {
		t.Helper()
		states := map[string]runtimeapi.ContainerState{}
		// Unfiltered (read encoded) and filtered (decoded) lists.
		for _, req := range []*runtimeapi.ListContainersRequest{{}, {Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb.PodSandboxId}}} {
			kubeletSends(req)
			if req.Filter != nil {
				kubeletSends(req.Filter)
			}
			m := mark("ListContainers")
			l, err := k.ListContainers(c, req)
			if err != nil {
				t.Fatal(err)
			}
			answered(what+" list", l)
			for _, ct := range l.Containers {
				answered(what+" list entry "+ct.Metadata.GetName(), ct)
				states[ct.Id] = ct.State
			}
			arrived("ListContainers", m, func(m proto.Message) []proto.Message {
				if f := m.(*runtimeapi.ListContainersRequest).Filter; f != nil {
					return []proto.Message{f}
				}
				return nil
			})
		}
		s, err := k.StreamContainers(c, kubeletSends(&runtimeapi.StreamContainersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			answered(what+" stream", m)
			for _, ct := range m.Containers {
				answered(what+" stream entry "+ct.Metadata.GetName(), ct)
			}
		}
		return states
	}
	status(ids["main"])
	lists("running")
	m = mark("PodSandboxStatus")
	ps, err := k.PodSandboxStatus(c, kubeletSends(&runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId}))
	if err != nil {
		t.Fatal(err)
	}
	answered("PodSandboxStatus", ps, ps.Status)
	arrived("PodSandboxStatus", m, nil)

	// main exits 3: its rule restarts the pod after a hold of a minute,
	// during which main is shown running, its status and list entry edited.
	if err := rt.Exit(ids["main"], 3); err != nil {
		t.Fatal(err)
	}
	// The first status read after the exit classifies it (or the event
	// feed did before): the hold begins, and main is shown running.
	deadline := time.Now().Add(10 * time.Second)
	for status(ids["main"]).Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		if time.Now().After(deadline) {
			t.Fatal("main's held exit never shown running")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s, _, _ := rt.Container(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("main is %s at the runtime, want EXITED (held)", s.State)
	}
	if st := lists("held"); st[ids["main"]] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("held main listed %s, want shown running", st[ids["main"]])
	}

	// The kubelet's teardown.
	unary("StopContainer", func() (proto.Message, error) {
		return k.StopContainer(c, kubeletSends(&runtimeapi.StopContainerRequest{ContainerId: ids["orch"]}))
	})
	unary("RemoveContainer", func() (proto.Message, error) {
		return k.RemoveContainer(c, kubeletSends(&runtimeapi.RemoveContainerRequest{ContainerId: ids["orch"]}))
	})
	unary("StopPodSandbox", func() (proto.Message, error) {
		return k.StopPodSandbox(c, kubeletSends(&runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}))
	})
	unary("RemovePodSandbox", func() (proto.Message, error) {
		return k.RemovePodSandbox(c, kubeletSends(&runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}))
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.streams) == 0 || !fakeruntime.HasUnknown(rec.streams[len(rec.streams)-1], fromKubelet) {
		t.Errorf("StreamContainers reached the runtime without the kubelet's unknown field (%d streams)", len(rec.streams))
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
