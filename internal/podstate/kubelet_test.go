package podstate

// The tests' kubelet: the calls it makes through the manager, and a manager
// over the fake runtime.

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/proxy"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
)

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
		Labels:      map[string]string{podUIDLabel: "uid-1"},
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

// list lists containers through the manager's view, as the kubelet's global
// relist does (no filter).
func (k kubelet) list() map[string]runtimeapi.ContainerState {
	return k.listWith(&runtimeapi.ListContainersRequest{})
}

// listWith lists containers with req through the manager's view.
func (k kubelet) listWith(req *runtimeapi.ListContainersRequest) map[string]runtimeapi.ContainerState {
	var resp runtimeapi.ListContainersResponse
	k.callBytes(k.m.ListContainersBytes, req, &resp, func(ctx context.Context, b []byte) (proto.Message, error) {
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

func newTestManager(t *testing.T, rt *fakeRT, dir string) *Manager {
	t.Helper()
	m, err := New(rt, dir, backoff.NewTracker(testCurve, nil), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

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
