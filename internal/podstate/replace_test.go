package podstate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet kills a held instance after a liveness probe failed and
// creates the next one at once: the create is refused without waiting, and
// only the restart's own instance is created. A container the restart does
// not replace is created as before.
func TestCreateDuringHeldRestartRefused(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur)
	if p.Phase != restartrecord.PhaseTerminating || p.Scope != "main" {
		t.Fatalf("test setup: phase %s scope %q", p.Phase, p.Scope)
	}
	create := func(name string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := k.m.CreateContainer(ctx, k.createReq(sb, name, 1), fwd(k.cri.CreateContainer))
		return err
	}
	start := time.Now()
	err := create("main")
	if status.Code(proxy.Status(err)) != codes.Unavailable || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("the kubelet's create of main during its held restart: %v after %s, want Unavailable at once", err, time.Since(start))
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if n := len(k.created()); n != 2 {
		t.Fatalf("created %v, want main and the restart's one instance", k.created())
	}
	// Not held any more: the kubelet's creates go through.
	if err := create("side"); err != nil {
		t.Fatal(err)
	}
}

// The kubelet's StopContainer of an instance that has already exited on its
// own, before the shim saw the exit (a liveness probe failing right after
// the process died; the kubelet's view predates the exit): the exit is the
// container's, so its rule governs it and the restart keeps the curve. A
// running container the kubelet stops is still the kubelet's decision.
func TestStopOfExitedInstanceKeepsItsRule(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	cur := p.Latest["main"]
	k.exit(cur, 1) // nobody has looked yet
	stop := func(id string) {
		t.Helper()
		if _, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: id},
			func(ctx context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
				return k.cri.StopContainer(ctx, r)
			}); err != nil {
			t.Fatal(err)
		}
	}
	stop(cur)
	wantHeld(t, p, cur, "after the kubelet's stop of an instance that had exited 1")
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	next := p.Latest["main"]
	stop(next) // running: the kubelet's decision
	if s := k.status(next); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 137 || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("kubelet-stopped running instance: %v/%d, phase %s; want its real exit and no restart", s.State, s.ExitCode, p.Phase)
	}
}

// aheadClock is the real clock moved on by d.
type aheadClock time.Duration

func (a aheadClock) Now() time.Time { return time.Now().Add(time.Duration(a)) }

// The kubelet's stop arrives after the process died but before the runtime
// recorded the exit (containerd still says RUNNING): the runtime's exit
// time, before the stop was asked, shows the exit was the container's own,
// so its rule governs it once the stop returns, and the kubelet's create
// that follows is refused. The shim's clock runs 0.5 s ahead here: the stop
// "arrived" 0.5 s after the exit the stop's own call records.
func TestStopRacingTheRuntimesExitKeepsItsRule(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	cur := p.Latest["main"]
	k.m.clock = aheadClock(500 * time.Millisecond)
	_, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: cur},
		func(ctx context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
			k.exit(cur, 1) // the exit the runtime records only now
			return k.cri.StopContainer(ctx, r)
		})
	if err != nil {
		t.Fatal(err)
	}
	wantHeld(t, p, cur, "after a stop racing the runtime's exit")
	wantCreateRefused(t, k, sb)
}

// When the verdict of such an exit cannot be written, the stop is answered
// Unavailable and the instance stays unsettled: the kubelet's retried stop
// classifies the exit again, and its rule governs it once the write works.
func TestStopRacingTheRuntimesExitRetriedAfterAFailedWrite(t *testing.T) {
	k, _, p := crashingMainPod(t)
	cur := p.Latest["main"]
	k.m.clock = aheadClock(500 * time.Millisecond)
	failing := false
	failWrites(k.m, func([]byte) bool { return failing })
	stop := func(exit bool) error {
		_, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: cur},
			func(ctx context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
				if exit {
					k.exit(cur, 1)
					failing = true // the verdict's write fails
				}
				return k.cri.StopContainer(ctx, r)
			})
		return err
	}
	if err := stop(true); status.Code(proxy.Status(err)) != codes.Unavailable || p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("stop with the verdict unwritten: %v, phase %s; want Unavailable and no restart", err, p.Phase)
	}
	failing = false
	if err := stop(false); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, p, cur, "after the retried stop")
}

// The kubelet's stop lands while containerd handles the process's exit: the
// task is deleted, so the stop returns at once with the container still
// RUNNING, and the exit is recorded a moment later with the time the
// process died (events.go, container_stop.go). The shim waits for that
// record: the exit was the container's own, so its rule governs it, and the
// kubelet's create that follows is refused.
func TestStopDuringTheRuntimesExitHandlingKeepsItsRule(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	cur := p.Latest["main"]
	record, err := k.rt.ExitUnrecorded(cur, 1)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, record)
	_, err = k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: cur, Timeout: 2}, fwd(k.cri.StopContainer))
	if err != nil {
		t.Fatal(err)
	}
	wantHeld(t, p, cur, "after a stop during the runtime's handling of the exit")
	wantCreateRefused(t, k, sb)
}

// A shim killed while the kubelet's stop runs: the time the stop was asked
// is on disk before the stop acts, so the restarted shim still tells the
// container's own exit (before it: its rule) from the one the stop caused
// (after it: none).
func TestStopAskedSurvivesAShimRestart(t *testing.T) {
	for _, own := range []bool{true, false} {
		t.Run(map[bool]string{true: "own exit", false: "stop's exit"}[own], func(t *testing.T) {
			dir := t.TempDir()
			k := newKubelet(t, dir)
			sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
			cur := k.start(sb, "main")
			var record func()
			if own {
				var err error
				if record, err = k.rt.ExitUnrecorded(cur, 1); err != nil {
					t.Fatal(err)
				}
			}
			killed := errors.New("the shim was killed")
			_, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: cur, Timeout: 2},
				func(context.Context, *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
					return nil, killed
				})
			if !errors.Is(err, killed) {
				t.Fatalf("stop: %v", err)
			}
			if own {
				record()
			} else if _, err := k.cri.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: cur, Timeout: 2}); err != nil {
				t.Fatal(err)
			}
			k = k.restarted(dir)
			k.status(cur) // the kubelet's next look
			p := k.m.pods.Get(sb)
			if restarted := p.Phase == restartrecord.PhaseTerminating && p.Trigger != nil && p.Trigger.ContainerID == cur; restarted != own {
				t.Fatalf("after a restart of the shim: phase %s trigger %+v; want a restart %v", p.Phase, p.Trigger, own)
			}
		})
	}
}

// The kubelet stops one container while the restart of another holds the
// pod's phase: the stop is recorded all the same, so once that restart is
// over the exit it caused is still the kubelet's, not a rule's.
func TestStopDuringAnotherContainersRestartIsTheKubelets(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0, podspec.RestartRulesPrefix + "side": restartNotIn0})
	main, side := k.start(sb, "main"), k.start(sb, "side")
	p := k.m.pods.Get(sb)
	k.exit(main, 1)
	k.status(main)
	if p.Phase != restartrecord.PhaseTerminating || p.Scope != "main" {
		t.Fatalf("test setup: phase %s scope %q", p.Phase, p.Scope)
	}
	if _, err := k.m.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: side, Timeout: 2}, fwd(k.cri.StopContainer)); err != nil {
		t.Fatal(err)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if s := k.status(side); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || p.Phase != restartrecord.PhaseRunning || len(k.created()) != 3 {
		t.Fatalf("side after main's restart: %v, phase %s, created %v; want its real exit and only main restarted", s.State, p.Phase, k.created())
	}
}

// wantHeld fails t unless p's restart, triggered by instance id's exit 1,
// is in progress.
func wantHeld(t *testing.T, p *restartrecord.Pod, id, after string) {
	t.Helper()
	if p.Phase != restartrecord.PhaseTerminating || p.Trigger == nil || p.Trigger.ContainerID != id || p.Trigger.ExitCode != 1 {
		t.Fatalf("%s: phase %s trigger %+v, want its restart held", after, p.Phase, p.Trigger)
	}
}

// wantCreateRefused fails t unless the kubelet's create of main is refused
// (the restart in progress creates it).
func wantCreateRefused(t *testing.T, k kubelet, sb string) {
	t.Helper()
	_, err := k.m.CreateContainer(context.Background(), k.createReq(sb, "main", 1), fwd(k.cri.CreateContainer))
	if status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("the kubelet's create after the stop: %v, want Unavailable (the restart creates it)", err)
	}
}
