package podstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// failWrites makes the pod store's writes fail, as on a full or read-only
// disk, while fail reports true for the record about to be written.
func failWrites(m *Manager, fail func(record []byte) bool) {
	write := m.st.Write
	m.st.Write = func(path string, b []byte) error {
		if fail(b) {
			return syscall.ENOSPC
		}
		return write(path, b)
	}
}

func always([]byte) bool { return true }

// tryStatus is status, returning the call's error.
func (k kubelet) tryStatus(id string) (*runtimeapi.ContainerStatus, error) {
	b, _ := proto.Marshal(&runtimeapi.ContainerStatusRequest{ContainerId: id})
	out, err := k.view().ContainerStatusBytes(context.Background(), b, func(ctx context.Context, req []byte) ([]byte, error) {
		var r runtimeapi.ContainerStatusRequest
		if err := proto.Unmarshal(req, &r); err != nil {
			return nil, err
		}
		resp, err := k.cri.ContainerStatus(ctx, &r)
		if err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	})
	if err != nil {
		return nil, err
	}
	var resp runtimeapi.ContainerStatusResponse
	return resp.Status, proto.Unmarshal(out, &resp)
}

// tryList is list, returning the call's error.
func (k kubelet) tryList() error {
	b, _ := proto.Marshal(&runtimeapi.ListContainersRequest{})
	_, err := k.view().ListContainersBytes(context.Background(), b, func(ctx context.Context, req []byte) ([]byte, error) {
		resp, err := k.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	})
	return err
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(proxy.Status(err)) != codes.Unavailable || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("%s: %v, want Unavailable with the write error", what, err)
	}
}

// An exit whose verdict cannot be recorded starts no restart: every status
// path the kubelet reads answers Unavailable (so it does not act on the exit
// either), nothing is stopped, the backoff curve does not move, and the shim
// is not ready. Once writes succeed the exit is classified as usual.
func TestExitNotRecordedIsNotActedOn(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	p := k.m.pods.Get(sb)
	failing := true
	failWrites(k.m, func([]byte) bool { return failing })
	k.exit(ids["main"], 88)
	_, err := k.tryStatus(ids["main"])
	wantUnavailable(t, "ContainerStatus of the exit", err)
	wantUnavailable(t, "ListContainers", k.tryList())
	if !k.m.DropEvent(&runtimeapi.ContainerEventResponse{ContainerId: ids["main"], ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		ContainersStatuses: []*runtimeapi.ContainerStatus{k.container(ids["main"])}}) {
		t.Fatal("the exit's event reached the kubelet")
	}
	if p.Phase != restartrecord.PhaseRunning || p.Trigger != nil || p.Inst(ids["main"]).Settled {
		t.Fatalf("unrecorded verdict in force: phase %s trigger %+v", p.Phase, p.Trigger)
	}
	if _, _, ok := k.m.bo.Get(backoff.Key{PodUID: p.UID}); ok {
		t.Fatal("the backoff curve moved for a restart that did not start")
	}
	if statefile.Healthy() == nil {
		t.Fatal("statefile reports healthy after a failed write")
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil || len(k.stopped()) != 0 || len(k.created()) != 3 {
		t.Fatalf("acted on the unrecorded exit: stopped %v created %v (%v)", k.stopped(), k.created(), err)
	}

	failing = false
	s, err := k.tryStatus(ids["main"])
	if err != nil || s.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after writes recovered: %v %v", s, err)
	}
	if p.Phase != restartrecord.PhaseTerminating || p.Trigger.Delay != testCurve.Delay(1) {
		t.Fatalf("phase %s, delay %s: want the restart, first step of the curve", p.Phase, p.Trigger.Delay)
	}
	if err := statefile.Healthy(); err != nil {
		t.Fatalf("still unhealthy after a successful write: %v", err)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil || p.Phase != restartrecord.PhaseRunning || p.Restarts != 1 {
		t.Fatalf("restart after recovery: phase %s restarts %d (%v)", p.Phase, p.Restarts, err)
	}
}

// Every CRI call whose step cannot be recorded fails with Unavailable and the
// step is not carried out; the executor's steps fail and are retried.
func TestStepsNotRecordedAreNotCarriedOut(t *testing.T) {
	ctx := context.Background()
	t.Run("RunPodSandbox", func(t *testing.T) {
		k := newKubelet(t, t.TempDir())
		var mu sync.Mutex
		var calls []string
		record := func(_ context.Context, method string, req any) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, method+" "+req.(interface{ GetPodSandboxId() string }).GetPodSandboxId())
			return nil
		}
		k.rt.OnCall("StopPodSandbox", record)
		k.rt.OnCall("RemovePodSandbox", record)
		failWrites(k.m, always)
		k.rt.NextIDs("sb1")
		_, err := k.admissions().Run(ctx, &runtimeapi.RunPodSandboxRequest{Config: k.podConfig(map[string]string{podspec.RestartRulesPrefix + "main": rules88})},
			fwd(k.cri.RunPodSandbox))
		wantUnavailable(t, "RunPodSandbox", err)
		mu.Lock()
		defer mu.Unlock()
		if _, left := k.rt.Sandbox("sb1"); left || k.m.Tracked() != 0 || fmt.Sprint(calls) != "[StopPodSandbox sb1 RemovePodSandbox sb1]" {
			t.Fatalf("tracked %d, sandbox calls %v, left %v: want the sandbox taken down and untracked", k.m.Tracked(), calls, left)
		}
	})
	t.Run("CreateContainer", func(t *testing.T) {
		k := newKubelet(t, t.TempDir())
		sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": rules88})
		failWrites(k.m, always)
		_, err := k.m.CreateContainer(ctx, k.createReq(sb, "main", 0), fwd(k.cri.CreateContainer))
		wantUnavailable(t, "CreateContainer", err)
		p := k.m.pods.Get(sb)
		removed := k.rt.Requests("RemoveContainer")
		if _, left := k.rt.Counts(); len(removed) != 1 || left != 0 || len(p.Instances) != 0 || len(p.Seq) != 0 || k.m.pods.Indexed() != 0 {
			t.Fatalf("removed %v, left %d, recorded %v %v", removed, left, p.Instances, p.Seq)
		}
	})
	t.Run("StopContainer", func(t *testing.T) {
		k, sb, ids := setup(t, t.TempDir())
		failWrites(k.m, always)
		forwarded := false
		_, err := k.m.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ids["main"]},
			func(context.Context, *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
				forwarded = true
				return &runtimeapi.StopContainerResponse{}, nil
			})
		wantUnavailable(t, "StopContainer", err)
		if forwarded || k.m.pods.Get(sb).Inst(ids["main"]).Settled {
			t.Fatal("the kubelet's stop was carried out without its record")
		}
	})
	t.Run("StopPodSandbox", func(t *testing.T) {
		k, sb, ids := setup(t, t.TempDir())
		k.exit(ids["main"], 88)
		k.status(ids["main"])
		failWrites(k.m, always)
		forwarded := false
		_, err := k.m.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb},
			func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
				forwarded = true
				return &runtimeapi.StopPodSandboxResponse{}, nil
			})
		wantUnavailable(t, "StopPodSandbox", err)
		if p := k.m.pods.Get(sb); forwarded || p.Stopped || p.Phase != restartrecord.PhaseTerminating {
			t.Fatalf("forwarded %v, stopped %v, phase %s", forwarded, p.Stopped, p.Phase)
		}
	})
	t.Run("restart steps", func(t *testing.T) {
		k, sb, ids := setup(t, t.TempDir())
		k.exit(ids["main"], 88)
		k.status(ids["main"])
		failWrites(k.m, always)
		err := runSteps(k.m, ctx, sb)
		if !errors.Is(err, statefile.ErrNotDurable) || len(k.stopped()) != 0 || len(k.created()) != 3 {
			t.Fatalf("step not recorded: %v, stopped %v, created %v", err, k.stopped(), k.created())
		}
	})
	t.Run("swap", func(t *testing.T) {
		k, sb, ids := setup(t, t.TempDir())
		p := k.m.pods.Get(sb)
		k.exit(ids["main"], 88)
		k.status(ids["main"])
		failing := true
		failWrites(k.m, func(b []byte) bool { return failing && strings.Contains(string(b), `"phase":"Running"`) })
		if err := runSteps(k.m, ctx, sb); !errors.Is(err, statefile.ErrNotDurable) || p.Phase != restartrecord.PhaseStartup || len(p.PartOf(restartrecord.PartNew)) != 3 {
			t.Fatalf("swap not recorded: %v, phase %s, new %v", err, p.Phase, p.PartOf(restartrecord.PartNew))
		}
		for id, st := range k.list() {
			if p.Inst(id).Part == restartrecord.PartNew {
				t.Fatalf("new instance %s shown (%v) before its swap was recorded", id, st)
			}
		}
		failing = false
		if err := runSteps(k.m, ctx, sb); err != nil || p.Phase != restartrecord.PhaseRunning || p.Restarts != 1 || len(k.created()) != 6 {
			t.Fatalf("retried swap: %v, phase %s, restarts %d, created %v", err, p.Phase, p.Restarts, k.created())
		}
	})
}
