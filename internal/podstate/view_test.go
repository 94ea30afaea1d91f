package podstate

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	running = runtimeapi.ContainerState_CONTAINER_RUNNING
	exited  = runtimeapi.ContainerState_CONTAINER_EXITED
)

// restartingPod is a record in Startup: old instance "old" (the trigger,
// exited) shown running, new instance "new" hidden.
func restartingPod() *Pod {
	return &Pod{SandboxID: "sb", Phase: PhaseStartup,
		IDs:  map[string]string{"old": "main", "new": "main"},
		Fake: map[string]bool{"old": true}, New: map[string]string{"new": "main"}, Dead: map[string]bool{"old": true}}
}

// swapped is p after its swap at epoch 1.
func swapped(p *Pod) *Pod {
	p.preSwap = swapPicture{epoch: 1, fake: p.Fake, hidden: p.New}
	p.Phase, p.Fake, p.New = PhaseRunning, nil, nil
	return p
}

func TestRestartShowsOldRunningAndHidesNew(t *testing.T) {
	p := restartingPod()
	vs := []cview{{id: "old", sandbox: "sb", name: "main", state: exited}, {id: "new", sandbox: "sb", name: "main", state: running}}
	got := listVerdicts(func(string) *Pod { return p }, vs, nil, 0)
	if !got[0].fake || !got[0].running || got[0].hide || !got[1].hide {
		t.Fatalf("verdicts %+v: want old faked running, new hidden", got)
	}
}

func TestRunningPodIsShownAsItIs(t *testing.T) {
	p := swapped(restartingPod())
	vs := []cview{{id: "old", sandbox: "sb", name: "main", state: exited}, {id: "new", sandbox: "sb", name: "main", state: running}}
	got := listVerdicts(func(string) *Pod { return p }, vs, nil, 1)
	if got[0].fake || got[0].hide || got[0].running || got[1].hide || !got[1].running {
		t.Fatalf("verdicts %+v: want old exited, new running", got)
	}
}

// The intermediate state the kubelet refused (about one status update in
// 4,000 restarts under make bench-backoff): a list forwarded before a swap
// and viewed after it. The runtime's answer lacks the new instance; viewed
// with the record after the swap it showed the old instance exited and no
// new one, so the kubelet published the container terminated, then running.
func TestAnswerAskedBeforeSwapIsViewedAsBefore(t *testing.T) {
	p := swapped(restartingPod())
	vs := []cview{{id: "old", sandbox: "sb", name: "main", state: exited}}
	got := listVerdicts(func(string) *Pod { return p }, vs, nil, 0)
	if !got[0].fake || !got[0].running || !got[0].heldBySwap {
		t.Fatalf("verdict %+v: want old shown running, and held by a relist", got[0])
	}
	if !statusShownRunning(p, "old", 0, time.Now()) {
		t.Fatal("status asked before the swap shows the old instance exited")
	}
	if statusShownRunning(p, "old", 1, time.Now()) {
		t.Fatal("status asked after the swap shows the old instance running")
	}
}

func TestStateFilterAppliesToTheView(t *testing.T) {
	p := restartingPod()
	vs := []cview{{id: "old", sandbox: "sb", name: "main", state: exited}, {id: "x", sandbox: "other", name: "x", state: exited}}
	want := &runtimeapi.ContainerStateValue{State: running}
	got := listVerdicts(func(sb string) *Pod {
		if sb == "sb" {
			return p
		}
		return nil
	}, vs, want, 0)
	if got[0].hide || !got[0].fake || !got[1].hide {
		t.Fatalf("verdicts %+v: want the faked old instance kept by a running filter, the untracked exited one dropped", got)
	}
}

func TestHeldStatusShownRunningUntilExpiry(t *testing.T) {
	p := swapped(restartingPod())
	now := time.Now()
	p.held = map[string]time.Time{"old": now.Add(time.Second)}
	if !statusShownRunning(p, "old", 1, now) {
		t.Fatal("held instance not shown running")
	}
	if statusShownRunning(p, "old", 1, now.Add(2*time.Second)) {
		t.Fatal("expired hold still shows the instance running")
	}
	p.Stopped = true
	if statusShownRunning(p, "old", 1, now) {
		t.Fatal("hold of a stopped pod still shows the instance running")
	}
}

// Through the manager: a full list whose runtime answer is made before a
// swap and viewed after it shows the old instance running, and holds it for
// the statuses that follow the relist.
func TestListRacingSwapNeverShowsContainerTerminated(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	old := k.start(sb, "main")
	rt.exit(old, 1)
	k.status(old) // classified: the restart begins
	b, _ := proto.Marshal(&runtimeapi.ListContainersRequest{})
	out, err := k.m.ListContainersBytes(context.Background(), b, func(ctx context.Context, _ []byte) ([]byte, error) {
		resp, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return nil, err
		}
		// The restart completes while the answer is on its way.
		if err := k.m.execute(ctx, sb); err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	})
	if err != nil {
		t.Fatal(err)
	}
	var resp runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	if p := k.m.pods[sb]; p.Phase != PhaseRunning || p.ContainerRestarts["main"] != 1 {
		t.Fatalf("restart did not complete during the list: phase %s", p.Phase)
	}
	if len(resp.Containers) != 1 || resp.Containers[0].Id != old || resp.Containers[0].State != running {
		t.Fatalf("list asked before the swap: %v, want only the old instance, running", resp.Containers)
	}
	if s := k.status(old); s.State != running {
		t.Fatalf("status after that list: %v, want running until the next relist", s.State)
	}
	nw := k.m.pods[sb].Latest["main"]
	if got := k.list(); got[old] != exited || got[nw] != running {
		t.Fatalf("next list: %v, want old exited and new running", got)
	}
}
