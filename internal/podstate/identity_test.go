package podstate

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// Removing the old sandbox of a pod leaves the backoff curve of the pod's
// live sandbox where it is (item 7 of issue 14): its next restart waits the
// next step of the curve, not the initial delay again.
func TestRemovingOldSandboxKeepsLiveBackoff(t *testing.T) {
	for _, tc := range []struct{ name, rules string }{
		{"Restart", `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`},
		{"RestartAllContainers", `[{"action":"RestartAllContainers","exitCodes":{"operator":"NotIn","values":[0]}}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newKubelet(t, t.TempDir())
			ann := map[string]string{podspec.RestartRulesPrefix + "main": tc.rules}
			exit := func(sb string, want time.Duration) {
				t.Helper()
				p := k.m.pods.Get(sb)
				id := p.Latest["main"]
				k.exit(id, 1)
				k.status(id)
				if p.Phase != restartrecord.PhaseTerminating || p.Trigger.Delay != want {
					t.Fatalf("%s: phase %s, delay %s, want a restart after %s", sb, p.Phase, p.Trigger.Delay, want)
				}
			}
			// The old sandbox restarted once, then the kubelet stopped it.
			k.runSandbox("sb-old", ann)
			k.start("sb-old", "main")
			exit("sb-old", testCurve.Delay(1))
			if _, err := k.m.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: "sb-old"},
				func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
					return &runtimeapi.StopPodSandboxResponse{}, nil
				}); err != nil {
				t.Fatal(err)
			}
			// The pod's new sandbox continues the pod's curve and is in backoff.
			k.runSandbox("sb1", ann)
			k.start("sb1", "main")
			exit("sb1", testCurve.Delay(2))
			// The kubelet's garbage collection removes the old sandbox.
			k.removeSandbox("sb-old")
			if err := runSteps(k.m, context.Background(), "sb1"); err != nil {
				t.Fatal(err)
			}
			exit("sb1", testCurve.Delay(3))
			// Removing the live sandbox forgets its curve.
			k.removeSandbox("sb1")
			k.runSandbox("sb2", ann)
			k.start("sb2", "main")
			exit("sb2", testCurve.Delay(1))
		})
	}
}
