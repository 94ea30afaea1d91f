package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// The fake runtime every unit test runs on (internal/fakeruntime) answers
// a short CRI sequence as the node's containerd does: the same gRPC codes
// and messages (IDs aside), and the same fields of sandboxes, containers,
// exec results and events that the unit tests rely on. The sequence covers
// what the fake models: name reservations, images (unknown, ambiguous),
// start only from CREATED, ExecSync (state, program result, missing
// program, timeout, unknown container), stops and removes of known and
// unknown objects, NotFound statuses.
func TestFakeRuntimeMatchesContainerd(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	// The same pod on both, so names and paths compare.
	uid, logs := fmt.Sprintf("parity-%d", time.Now().UnixNano()), t.TempDir()
	want := paritySequence(t, dial(t, node.env["CONTAINERD_SOCK"]), uid, logs)
	olderContainerd(t, want)

	fake := fakeruntime.Start(t)
	// The commands the sequence runs, as busybox runs them.
	fake.AddProgram("sh", func(_ context.Context, _ string, cmd []string) fakeruntime.ExecResult {
		if slices.Equal(cmd, parityExec) {
			return fakeruntime.ExecResult{Stdout: []byte("out\n"), Stderr: []byte("err\n"), ExitCode: 3}
		}
		return fakeruntime.ExecResult{ExitCode: 127}
	})
	fake.AddProgram("sleep", func(ctx context.Context, _ string, _ []string) fakeruntime.ExecResult {
		<-ctx.Done()
		return fakeruntime.ExecResult{ExitCode: 137}
	})
	got := paritySequence(t, fake.Conn, uid, logs)

	for i := range max(len(want), len(got)) {
		var w, g parityStep
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Errorf("step %d:\n  containerd %s: %v %q %s\n  fake       %s: %v %q %s", i, w.Call, w.Code, w.Msg, w.Got, g.Call, g.Code, g.Msg, g.Got)
		}
	}
	t.Logf("%d steps compared with containerd %s", len(want), node.env["CONTAINERD_VERSION"])
}

// olderContainerd takes out of containerd's steps what 2.2 and 2.3 answer
// differently from 2.4, the version the fake models; each step must differ
// exactly so. Their CreateContainer first asks whether the image is a
// checkpoint image, and an unknown one fails that question (v2.3.7
// internal/cri/server/container_create.go: "failed to check if this is a
// checkpoint image: %w"). 2.2's statuses and lists have no image_id and its
// statuses no stop_signal (v2.2.9 container_status.go, container_list.go;
// 2.3 added both).
func olderContainerd(t *testing.T, steps []parityStep) {
	t.Helper()
	v := node.env["CONTAINERD_VERSION"]
	if !strings.HasPrefix(v, "2.2.") && !strings.HasPrefix(v, "2.3.") {
		return
	}
	const prefix = "failed to check if this is a checkpoint image: "
	// 2.2's fields, as 2.4 gives them for this sequence's container.
	fields22 := strings.NewReplacer("imageId= ", "imageId=sha256:<image> ", "stop=SIGNAL_RUNTIME_DEFAULT", "stop=SIGNAL_SIGTERM")
	for i, s := range steps {
		switch {
		case s.Call == "CreateContainer unknown image":
			if !strings.HasPrefix(s.Msg, prefix) {
				t.Errorf("containerd %s, %s: %q does not begin with %q", v, s.Call, s.Msg, prefix)
			}
			steps[i].Msg = strings.TrimPrefix(s.Msg, prefix)
		case strings.HasPrefix(v, "2.2.") && (s.Call == "ContainerStatus" || s.Call == "ListContainers") && s.Code == codes.OK:
			got := fields22.Replace(s.Got + " ")
			if got == s.Got+" " {
				t.Errorf("containerd %s, %s: %q lacks neither image_id nor stop_signal", v, s.Call, s.Got)
			}
			steps[i].Got = strings.TrimSuffix(got, " ")
		}
	}
}

// parityExec is the command whose result is compared.
var parityExec = []string{"sh", "-c", "echo out; echo err >&2; exit 3"}

// parityStep is what one call answered, in a form both runtimes share.
type parityStep struct {
	Call string
	Code codes.Code
	Msg  string // the status message, the run's IDs replaced by names
	Got  string // the fields compared, as text
}

// parityRun records the steps of one runtime and names the IDs it made.
type parityRun struct {
	t     *testing.T
	rt    runtimeapi.RuntimeServiceClient
	img   runtimeapi.ImageServiceClient
	steps []parityStep
	names map[string]string // ID: its name in messages
	image string            // the ID of the image containers are made from
}

var hexID = regexp.MustCompile(`[0-9a-f]{64}`)

// norm replaces the run's IDs in s by their names, any other ID by <id>.
func (r *parityRun) norm(s string) string {
	return hexID.ReplaceAllStringFunc(s, func(id string) string {
		if n, ok := r.names[id]; ok {
			return n
		}
		if r.image != "" && strings.HasSuffix(r.image, id) {
			return "<image>"
		}
		return "<id>"
	})
}

// step records a call's answer; got describes the response when err is nil.
func (r *parityRun) step(call string, err error, got func() string) {
	s := parityStep{Call: call, Code: status.Code(err)}
	if err != nil {
		s.Msg = r.norm(status.Convert(err).Message())
	} else if got != nil {
		s.Got = r.norm(got())
	}
	r.steps = append(r.steps, s)
}

func (r *parityRun) container(id string) string {
	resp, err := r.rt.ContainerStatus(ctxT(r.t, 30*time.Second), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	r.step("ContainerStatus", err, func() string {
		s := resp.GetStatus()
		return fmt.Sprintf("state=%s exit=%d reason=%q message=%q started=%v finished=%v image=%s ref=%s imageId=%s log=%s meta=%s/%d labels=%v annotations=%v stop=%s",
			s.State, s.ExitCode, s.Reason, s.Message, s.StartedAt != 0, s.FinishedAt != 0, r.imageName(s.Image.GetImage()), r.imageName(s.ImageRef), s.ImageId,
			s.LogPath, s.Metadata.GetName(), s.Metadata.GetAttempt(), s.Labels, s.Annotations, s.StopSignal)
	})
	return resp.GetStatus().GetState().String()
}

// imageName is "<the image>" when name (a tag, a digest reference or an ID)
// names the image the containers are made from, else name. containerd
// reports an image's first tag and repo digest, and which those are depends
// on what else on the node shares the image's content (a test before this
// one pushing the same busybox under critest's names, say); the fake knows
// only the name it was given.
func (r *parityRun) imageName(name string) string {
	if name == "" || r.image == "" {
		return name
	}
	is, err := r.img.ImageStatus(ctxT(r.t, 30*time.Second), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
	if err == nil && is.GetImage().GetId() == r.image {
		return "<the image>"
	}
	return name
}

func (r *parityRun) exec(id string, timeout int64, cmd ...string) {
	resp, err := r.rt.ExecSync(ctxT(r.t, 30*time.Second), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: timeout})
	r.step("ExecSync "+strings.Join(cmd, " "), err, func() string {
		return fmt.Sprintf("exit=%d stdout=%q stderr=%q", resp.ExitCode, resp.Stdout, resp.Stderr)
	})
}

// paritySequence runs the sequence on the runtime behind cc and returns its
// steps, the events of its objects last.
func paritySequence(t *testing.T, cc grpc.ClientConnInterface, uid, logs string) []parityStep {
	t.Helper()
	r := &parityRun{t: t, rt: runtimeapi.NewRuntimeServiceClient(cc), img: runtimeapi.NewImageServiceClient(cc), names: map[string]string{}}
	ctx := ctxT(t, time.Minute)
	evs := parityEvents(t, r.rt)
	is, err := r.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: busybox}})
	if err != nil || is.Image == nil {
		t.Fatalf("image %s on the runtime: %v %v", busybox, is, err)
	}
	r.image = is.Image.Id

	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "parity", Namespace: "e2e", Uid: uid}, LogDirectory: logs,
		Labels: map[string]string{"app": "parity"},
		// The node's network: no CNI call, as fast as the fake.
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
	sb, err := r.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	r.names[sb.PodSandboxId] = "<sandbox>"
	t.Cleanup(func() { removePod(r.rt, sb.PodSandboxId) })
	_, err = r.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	r.step("RunPodSandbox again", err, nil)
	sbStatus := func() {
		resp, err := r.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId})
		r.step("PodSandboxStatus", err, func() string {
			s := resp.GetStatus()
			return fmt.Sprintf("state=%s ip=%q meta=%s labels=%v", s.State, s.GetNetwork().GetIp(), s.Metadata.GetName(), s.Labels)
		})
	}
	sbStatus()

	cfg := func(image string) *runtimeapi.ContainerConfig {
		return &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"}, Image: &runtimeapi.ImageSpec{Image: image},
			Command: []string{"sleep", "3600"}, LogPath: "main/0.log",
			Labels: map[string]string{"c": "main"}, Annotations: map[string]string{"io.kubernetes.container.restartCount": "0"}}
	}
	create := func(call string, sbID string, c *runtimeapi.ContainerConfig) string {
		resp, err := r.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sbID, Config: c, SandboxConfig: sbCfg})
		r.step(call, err, nil)
		return resp.GetContainerId()
	}
	create("CreateContainer unknown image", sb.PodSandboxId, cfg("docker.io/library/no-such-image:parity"))
	create("CreateContainer no image", sb.PodSandboxId, cfg(""))
	create("CreateContainer unknown sandbox", strings.Repeat("0", 64), cfg(busybox))
	id := create("CreateContainer", sb.PodSandboxId, cfg(busybox))
	if id == "" {
		t.Fatal("no container")
	}
	r.names[id] = "<main>"
	create("CreateContainer same name", sb.PodSandboxId, cfg(busybox))
	r.container(id)
	r.exec(id, 0, "sh", "-c", "true")
	_, err = r.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	r.step("StartContainer", err, nil)
	_, err = r.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	r.step("StartContainer again", err, nil)
	r.container(id)
	r.exec(id, 0, parityExec...)
	r.exec(id, 0, "no-such-program")
	r.exec(id, 1, "sleep", "10")
	r.exec(strings.Repeat("f", 64), 0, "sh")
	_, err = r.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
	r.step("StopContainer", err, nil)
	r.container(id)
	_, err = r.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
	r.step("StopContainer again", err, nil)
	r.container(id)
	r.exec(id, 0, "sh")
	list, err := r.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb.PodSandboxId}})
	r.step("ListContainers", err, func() string {
		var out []string
		for _, c := range list.Containers {
			out = append(out, fmt.Sprintf("%s %s %s image=%s ref=%s imageId=%s", c.Id, c.Metadata.GetName(), c.State, c.Image.GetImage(), c.ImageRef, c.ImageId))
		}
		return strings.Join(out, "; ")
	})
	for _, call := range []string{"RemoveContainer", "RemoveContainer again"} {
		_, err = r.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		r.step(call, err, nil)
	}
	r.container(id)
	for _, call := range []string{"StopPodSandbox", "StopPodSandbox again"} {
		_, err = r.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId})
		r.step(call, err, nil)
	}
	sbStatus()
	for _, call := range []string{"RemovePodSandbox", "RemovePodSandbox again"} {
		_, err = r.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId})
		r.step(call, err, nil)
	}
	sbStatus()

	// The events of the run's objects, in order, until the sandbox's
	// DELETED event (the last the sequence causes).
	for _, e := range evs(sb.PodSandboxId, id) {
		r.steps = append(r.steps, parityStep{Call: "event", Got: r.norm(e)})
	}
	return r.steps
}

// parityEvents subscribes to rt's container events; the function it
// returns waits for the sandbox's DELETED event and returns the events
// of the sandbox and container given, each as its type, object and the
// states of the sandbox and of the containers it carries.
func parityEvents(t *testing.T, rt runtimeapi.RuntimeServiceClient) func(sandbox, container string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var all []*runtimeapi.ContainerEventResponse
	arrived := make(chan struct{}, 1)
	go func() {
		for {
			e, err := stream.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			all = append(all, e)
			mu.Unlock()
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
	}()
	return func(sandbox, container string) []string {
		deadline := time.After(10 * time.Second)
		for {
			var out []string
			done := false
			mu.Lock()
			for _, e := range all {
				if e.ContainerId != sandbox && e.ContainerId != container {
					continue
				}
				var cs []string
				for _, s := range e.ContainersStatuses {
					cs = append(cs, s.Id+"="+s.State.String())
				}
				out = append(out, fmt.Sprintf("%s %s sandbox=%s containers=%v", e.ContainerEventType, e.ContainerId, e.PodSandboxStatus.GetState(), cs))
				done = done || (e.ContainerId == sandbox && e.ContainerEventType == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
			}
			mu.Unlock()
			if done {
				return out
			}
			select {
			case <-arrived:
			case <-deadline:
				t.Errorf("no DELETED event of the sandbox within 10 s; events %v", out)
				return out
			}
		}
	}
}
