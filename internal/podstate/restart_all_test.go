package podstate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

func TestTriggerViewsAndReplay(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	p := k.m.pods.Get(sb)
	if len(p.Seq) != 3 || !p.Seq[0].WaitExit || p.Seq[1].WaitExit || p.Seq[2].WaitExit {
		t.Fatalf("start order %+v: want init (wait for exit), sidecar, main", p.Seq)
	}
	// main exits 88: the kubelet's first look already shows it running, and the restart begins.
	k.exit(ids["main"], 88)
	if s := k.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || s.ExitCode != 0 || s.FinishedAt != 0 {
		t.Fatalf("triggering exit shown to the kubelet: %+v", s)
	}
	if p.Phase != restartrecord.PhaseTerminating {
		t.Fatalf("phase %s", p.Phase)
	}
	// The completed init container is shown as it is (a terminated init
	// container shown running is an illegal transition for the kubelet).
	if st := k.list(); st[ids["init"]] != runtimeapi.ContainerState_CONTAINER_EXITED || st[ids["sidecar"]] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("view during termination: %v", st)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if p.Phase != restartrecord.PhaseRunning || p.Restarts != 1 {
		t.Fatalf("after the restart: phase %s restarts %d (%s)", p.Phase, p.Restarts, p.LastError)
	}
	if got := fmt.Sprint(k.created()[3:]); got != "[init sidecar main]" {
		t.Fatalf("replayed %s, want init, sidecar, main in order", got)
	}
	if stopped := k.stopped(); len(stopped) != 1 || stopped[0] != ids["sidecar"] {
		t.Fatalf("stopped %v, want only the running sidecar", stopped)
	}
	// New instances carry the next restart count and log file; once no read
	// of the pod can belong to a list from before the swap (a second read
	// began), the old main shows its real exit.
	k.readPod(sb, ids["main"])
	k.readPod(sb)
	st := k.list()
	if st[ids["main"]] != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old main after the swap: %v", st[ids["main"]])
	}
	all, err := k.cri.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all.Containers {
		id := c.Id
		if _, old := map[string]bool{ids["init"]: true, ids["sidecar"]: true, ids["main"]: true}[id]; old {
			continue
		}
		s := k.container(id)
		if s.Annotations[annotationRestartCount] != "1" || s.LogPath != filepath.Join(k.logDir, s.Metadata.Name, "1.log") || s.Metadata.Attempt != 1 {
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
	k.exit(newMain, 88)
	k.status(newMain)
	if p.Phase != restartrecord.PhaseTerminating {
		t.Fatalf("second trigger: phase %s", p.Phase)
	}
}

func TestNonMatchingExitIsShownAsIs(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.exit(ids["main"], 1)
	if s := k.status(ids["main"]); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 1 {
		t.Fatalf("non-matching exit changed: %+v", s)
	}
	if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseRunning || p.Trigger != nil {
		t.Fatalf("non-matching exit started a restart: %+v", p)
	}
}

func TestInitFailingDuringReplayIsHandedBack(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.ExitOnStart("init", 1)
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(k.created()[3:]); got != "[init]" {
		t.Fatalf("replayed %s after init failed; want only init", got)
	}
	if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("phase %s", p.Phase)
	}
	// The failed init instance is visible: the kubelet applies the pod's restartPolicy.
	for id, s := range k.list() {
		if k.container(id).Metadata.Name == "init" && id != ids["init"] && s != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("failed init shown as %v", s)
		}
	}
}

// A shim killed mid-restart resumes from its state directory.
func TestResumeAfterCrash(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	// "kill -9": a new manager over the same state directory and runtime.
	k2 := k.restarted(dir)
	m2 := k2.m
	p := m2.pods.Get(sb)
	if p == nil || p.Phase != restartrecord.PhaseTerminating || p.Trigger.ContainerID != ids["main"] {
		t.Fatalf("state after restart of the shim: %+v", p)
	}
	if s, _ := m2.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: ids["main"]}); s.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatal("test setup")
	}
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
		if ph == restartrecord.PhaseRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restart did not complete after resume: %s %s", ph, p.LastError)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	if n := len(k.created()); n != 6 {
		t.Fatalf("%d creates, want 3 + 3 (no duplicate restart)", n)
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
			k.exit(ids["main"], 88)
			k.status(ids["main"])
			p := k.m.pods.Get(sb)
			// Simulate: the executor recorded its intent for init/1, the runtime created it, then the shim died.
			p.LogDirectory = t.TempDir()
			p.Phase, p.Creating = restartrecord.PhaseStartup, "init/1"
			k.m.pods.Save(p)
			orphan, err := k.cri.CreateContainer(context.Background(), k.createReq(sb, "init", 1))
			if err != nil {
				t.Fatal(err)
			}
			if started {
				if _, err := k.cri.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: orphan.ContainerId}); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Join(p.LogDirectory, "init"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p.LogDirectory, "init", "1.log"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m2 := k.restarted(dir).m
			if err := runSteps(m2, context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			inits := 0
			for _, n := range k.created() {
				if n == "init" {
					inits++
				}
			}
			if inits != 2 {
				t.Fatalf("init created %d times, want 2 (original + adopted orphan %s)", inits, orphan.ContainerId)
			}
			if got := m2.pods.Get(sb).Latest["init"]; got != orphan.ContainerId || m2.pods.Get(sb).Phase != restartrecord.PhaseRunning {
				t.Fatalf("latest init %s, phase %s; want the adopted %s, Running", got, m2.pods.Get(sb).Phase, orphan.ContainerId)
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
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	p := k.m.pods.Get(sb)
	p.Phase = restartrecord.PhaseStartup
	resp, err := k.cri.CreateContainer(context.Background(), k.createReq(sb, "init", 1))
	if err != nil {
		t.Fatal(err)
	}
	k.cancelledStart(resp.ContainerId)
	k.m.pods.AddInstance(p, resp.ContainerId, "init", restartrecord.PartNew)
	k.m.pods.Save(p)
	m2 := k.restarted(dir).m
	if err := runSteps(m2, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(k.created()[4:]); got != "[init sidecar main]" {
		t.Fatalf("after an interrupted start the replay created %s, want init again then sidecar and main", got)
	}
	if _, _, still := k.rt.Container(resp.ContainerId); still {
		t.Fatal("the interrupted instance was left for the kubelet to see")
	}
}

// cancelledStart is a StartContainer of id whose caller is gone when the
// runtime carries it out, as when the shim dies mid-call: the runtime leaves
// the container exited with StartError, never started.
func (k kubelet) cancelledStart(id string) {
	k.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k.rt.OnCall("StartContainer", func(call context.Context, _ string, _ any) error {
		cancel()
		<-call.Done()
		return nil
	})
	defer k.rt.OnCall("StartContainer", nil)
	if _, err := k.cri.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); status.Code(err) != codes.Canceled {
		k.t.Fatalf("StartContainer whose caller is gone: %v, want Canceled", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for k.container(id).State == runtimeapi.ContainerState_CONTAINER_CREATED && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := k.container(id); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.StartedAt != 0 || s.Reason != "StartError" {
		k.t.Fatalf("after a start whose caller is gone: %v, want exited with StartError, never started", s)
	}
}

// Replays reuse the decoded CreateContainer request: attempts stay
// consecutive, a failed create does not skip one, and a container the
// kubelet creates again is replayed from its new request.
func TestReplayRequestReuse(t *testing.T) {
	k, sb, p := crashingMainPod(t)
	restart := func() string {
		t.Helper()
		cur := p.Latest["main"]
		k.exit(cur, 1)
		k.status(cur)
		if err := runSteps(k.m, context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		return p.Latest["main"]
	}
	attempt := func(id string) uint32 {
		return k.container(id).Metadata.Attempt
	}
	for want := uint32(1); want <= 3; want++ {
		if a := attempt(restart()); a != want {
			t.Fatalf("restart %d: attempt %d", want, a)
		}
	}
	// A failed create, then the retry: attempt 4, not 5.
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur)
	k.rt.FailNext("CreateContainer", 1, status.Error(codes.Unavailable, "create failed"))
	if err := runSteps(k.m, context.Background(), sb); err == nil {
		t.Fatal("the failing create succeeded")
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if a := attempt(p.Latest["main"]); a != 4 {
		t.Fatalf("after a failed create: attempt %d, want 4", a)
	}
	// The kubelet creates main again with another log path: the next replay
	// starts from that request.
	k.exit(p.Latest["main"], 0)
	req := k.createReq(sb, "main", 9)
	req.Config.Command = []string{"new"}
	resp, err := k.m.CreateContainer(context.Background(), req, fwd(k.cri.CreateContainer))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.cri.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	next := restart()
	if a, logPath := attempt(next), k.container(next).LogPath; a != 10 || logPath != filepath.Join(k.logDir, "main/10.log") {
		t.Fatalf("after the kubelet's create: attempt %d log %q, want 10 and main/10.log", a, logPath)
	}
}
