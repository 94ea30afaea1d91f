package podstate

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// terminationPod runs the setup pod with the termination annotation value
// (none when empty); its sidecar has a preStop exec hook and a 30 s grace
// period, and main exits 88, so the restart is about to stop the sidecar.
func terminationPod(t *testing.T, dir, value string) (kubelet, string, map[string]string) {
	t.Helper()
	k := newKubelet(t, dir)
	k.rt.ExitOnStart("init", 0)
	// The preStop hook's program: it ends at once, successfully.
	k.rt.AddProgram("sh", func(context.Context, string, []string) fakeruntime.ExecResult { return fakeruntime.ExecResult{} })
	ann := map[string]string{podspec.RestartRulesPrefix + "main": rules88}
	if value != "" {
		ann[podspec.TerminationKey] = value
	}
	sb := k.runPod(ann)
	ids := map[string]string{}
	for _, n := range []string{"init", "sidecar", "main"} {
		req := k.createReq(sb, n, 0)
		req.Config.Annotations[annotationGracePeriod] = "30"
		req.Config.Annotations[annotationPreStop] = `{"exec":{"command":["sh","-c","flush"]}}`
		resp, err := k.m.CreateContainer(context.Background(), req, fwd(k.cri.CreateContainer))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.cri.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
		ids[n] = resp.ContainerId
	}
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseTerminating {
		t.Fatalf("main's exit 88 did not start a restart: phase %s", p.Phase)
	}
	return k, sb, ids
}

// stopTimeout is the timeout of the runtime's last StopContainer of id.
func (k kubelet) stopTimeout(id string) (timeout int64, ok bool) {
	for _, r := range k.rt.Requests("StopContainer") {
		if r := r.(*runtimeapi.StopContainerRequest); r.ContainerId == id {
			timeout, ok = r.Timeout, true
		}
	}
	return timeout, ok
}

// execs are the IDs of the containers the runtime was asked to ExecSync in
// (preStop hooks), in order.
func (k kubelet) execs() []string {
	var ids []string
	for _, r := range k.rt.Requests("ExecSync") {
		ids = append(ids, r.(*runtimeapi.ExecSyncRequest).ContainerId)
	}
	return ids
}

func TestRestartStopsByTermination(t *testing.T) {
	for _, tc := range []struct {
		value       string
		wantTimeout int64
		wantPreStop bool
	}{
		// The kubelet's own stop: preStop, then what is left of the 30 s
		// (the fake's hook returns at once).
		{"", 30, true},
		{"graceful", 30, true},
		// Upstream RestartAllContainers: no preStop, the kubelet's 2 s minimum window.
		{"immediate", 2, false},
		// An unknown value is a problem, not a choice: graceful applies.
		{"now", 30, true},
	} {
		t.Run("value="+tc.value, func(t *testing.T) {
			k, sb, ids := terminationPod(t, t.TempDir(), tc.value)
			if err := runSteps(k.m, context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseRunning || p.Restarts != 1 {
				t.Fatalf("after the restart: phase %s restarts %d (%s)", p.Phase, p.Restarts, p.LastError)
			}
			side := ids["sidecar"]
			if got, ok := k.stopTimeout(side); !ok || got != tc.wantTimeout {
				t.Errorf("sidecar stopped (%v) with timeout %d s, want %d s", ok, got, tc.wantTimeout)
			}
			ranPreStop := strings.Contains(strings.Join(k.execs(), " "), side)
			if ranPreStop != tc.wantPreStop {
				t.Errorf("preStop hook ran in the sidecar: %v, want %v (execs %v)", ranPreStop, tc.wantPreStop, k.execs())
			}
		})
	}
}

// The choice is part of the pod's record: a shim restarted in the middle of
// a restart stops the remaining containers the way the pod chose.
func TestTerminationSurvivesShimRestart(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := terminationPod(t, dir, "immediate")
	m2 := k.restarted(dir).m
	if p := m2.pods.Get(sb); p == nil || p.Termination != podspec.TerminationImmediate {
		t.Fatalf("pod record after a shim restart: %v", p != nil && p.Termination == podspec.TerminationImmediate)
	}
	if err := runSteps(m2, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.stopTimeout(ids["sidecar"]); got != 2 || len(k.execs()) != 0 {
		t.Fatalf("resumed restart stopped the sidecar with timeout %d s and execs %v, want 2 s and none", got, k.execs())
	}
}

// An unknown value is reported like a malformed rule: on the pod's record
// (`cri-shim pods`) and in the problems counter; the rules still apply.
func TestUnknownTerminationIsAProblem(t *testing.T) {
	k, sb, _ := terminationPod(t, t.TempDir(), "kill -9")
	p := k.m.pods.Get(sb)
	if p.Termination != podspec.TerminationGraceful || len(p.Problems) != 1 ||
		!strings.Contains(p.Problems[0], `annotation restart.cri-shim.io/termination: unknown value "kill -9"`) {
		t.Fatalf("termination %q problems %q", p.Termination, p.Problems)
	}
	if n := testutil.ToFloat64(k.m.metrics.problems); n != 1 {
		t.Fatalf("problems counter %v, want 1", n)
	}
}
