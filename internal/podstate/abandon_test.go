package podstate

import (
	"context"
	"fmt"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

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
