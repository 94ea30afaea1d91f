package podstate

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// sidecarPod runs a pod whose sidecar has a rule for exit 88 and starts
// init (exits 0) and the sidecar, as the kubelet does before it creates main.
func sidecarPod(t *testing.T) (kubelet, string, *restartrecord.Pod) {
	t.Helper()
	k := newKubelet(t, t.TempDir())
	k.rt.ExitOnStart("init", 0)
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "sidecar": rules88})
	k.start(sb, "init")
	k.start(sb, "sidecar")
	return k, sb, k.m.pods.Get(sb)
}

// sidecarPodWithMain is sidecarPod with main created by the kubelet, not
// started.
func sidecarPodWithMain(t *testing.T) (kubelet, string, *restartrecord.Pod, string) {
	t.Helper()
	k, sb, p := sidecarPod(t)
	resp, err := k.m.CreateContainer(context.Background(), k.createReq(sb, "main", 0), fwd(k.cri.CreateContainer))
	if err != nil {
		t.Fatal(err)
	}
	return k, sb, p, resp.ContainerId
}

// The sidecar exits 88 while the kubelet's create of main is in the
// runtime: the create is refused and its container removed, so nothing
// runs beside the restart, which goes on as if main had not been created.
func TestCreateOvertakenByRestartRefused(t *testing.T) {
	k, sb, p := sidecarPod(t)
	sidecar := p.Latest["sidecar"]
	ctx := context.Background()
	var created string
	_, err := k.m.CreateContainer(ctx, k.createReq(sb, "main", 0),
		func(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			resp, err := k.cri.CreateContainer(ctx, req)
			if err == nil {
				created = resp.ContainerId
			}
			k.exit(sidecar, 88)
			k.status(sidecar) // the shim sees the exit: the rule matches
			return resp, err
		})
	if status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("create of main overtaken by the sidecar's restart: %v, want Unavailable", err)
	}
	if p.Phase != restartrecord.PhaseTerminating {
		t.Fatalf("phase %s, want the restart under way", p.Phase)
	}
	if _, _, ok := k.rt.Container(created); ok {
		t.Fatalf("the refused main %s is still in the runtime", created)
	}
	if p.Inst(created) != nil {
		t.Fatalf("the refused main %s is recorded in the pod", created)
	}
	if err := runSteps(k.m, ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("phase %s after the restart", p.Phase)
	}
	// The kubelet's retry after the swap goes through.
	if id := k.start(sb, "main"); k.container(id).State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("main after the restart: %v", k.container(id).State)
	}
}

// main was created before the sidecar's exit matched and the kubelet
// starts it afterwards: the start is refused (the restart creates main's
// next instance itself), so main never runs beside the restart or is seen
// stopped by it.
func TestStartOfReplacedInstanceRefused(t *testing.T) {
	k, sb, p, oldMain := sidecarPodWithMain(t)
	ctx, sidecar := context.Background(), p.Latest["sidecar"]
	k.exit(sidecar, 88)
	k.status(sidecar)
	if p.Phase != restartrecord.PhaseTerminating {
		t.Fatalf("phase %s, want the restart under way", p.Phase)
	}
	start := func(id string) error {
		_, err := k.m.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}, fwd(k.cri.StartContainer))
		return err
	}
	if err := start(oldMain); status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("the kubelet's start of main during the restart: %v, want Unavailable", err)
	}
	if s := k.container(oldMain).State; s != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Fatalf("refused main is %v, want never started", s)
	}
	if err := runSteps(k.m, ctx, sb); err != nil {
		t.Fatal(err)
	}
	newMain := p.Latest["main"]
	if newMain == oldMain || k.container(newMain).State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("main after the restart: %s (%v), want a new running instance", newMain, k.container(newMain).State)
	}
	// A start outside a restart is the kubelet's as before.
	other, err := k.m.CreateContainer(ctx, k.createReq(sb, "extra", 0), fwd(k.cri.CreateContainer))
	if err != nil {
		t.Fatal(err)
	}
	if err := start(other.ContainerId); err != nil {
		t.Fatalf("start with no restart in progress: %v", err)
	}
}

// The sidecar's exit matches while the kubelet's start of main is in the
// runtime: main is shown running for the rest of the restart and stopped
// only after its start returned, so the kubelet never sees it exit, and
// the restart's own instance replaces it.
func TestStartInFlightWhenRuleMatches(t *testing.T) {
	k, sb, p, oldMain := sidecarPodWithMain(t)
	ctx, sidecar := context.Background(), p.Latest["sidecar"]
	stepDuringStart := time.Duration(-1)
	_, err := k.m.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: oldMain},
		func(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
			k.exit(sidecar, 88)
			k.status(sidecar) // the rule matches before the runtime has started main
			// The restart's step, run now, must not stop main yet.
			wait, err := k.m.step(ctx, sb)
			if err != nil {
				t.Error(err)
			}
			stepDuringStart = wait
			return k.cri.StartContainer(ctx, req)
		})
	if err != nil {
		t.Fatalf("the kubelet's start that began before the match: %v", err)
	}
	if p.Phase != restartrecord.PhaseTerminating || stepDuringStart <= 0 {
		t.Fatalf("phase %s, step during the start waited %s: want the restart waiting for the start", p.Phase, stepDuringStart)
	}
	if slices.Contains(k.stopped(), oldMain) {
		t.Fatal("main was stopped while its start was in the runtime")
	}
	if hide, fake := p.View(p.Inst(oldMain)); hide || !p.Inst(oldMain).Shown {
		t.Fatalf("main during the restart: hidden %v, shown %v (fake %v); want shown running", hide, p.Inst(oldMain).Shown, fake)
	}
	if err := runSteps(k.m, ctx, sb); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(k.stopped(), oldMain) {
		t.Fatal("the restart did not stop the main the kubelet started")
	}
	newMain := p.Latest["main"]
	if newMain == oldMain || k.container(newMain).State != runtimeapi.ContainerState_CONTAINER_RUNNING || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("after the restart: main %s (%v), phase %s; want a new running instance", newMain, k.container(newMain).State, p.Phase)
	}
}
