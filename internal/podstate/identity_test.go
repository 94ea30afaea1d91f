package podstate

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runSandbox is RunPodSandbox of pod uid-1 answered with sandbox id sb, as
// when the kubelet creates a pod's sandbox again.
func (k kubelet) runSandbox(sb string, annotations map[string]string) {
	k.t.Helper()
	_, err := k.m.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata:    &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-1"},
		Annotations: annotations,
	}}, func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
		return &runtimeapi.RunPodSandboxResponse{PodSandboxId: sb}, nil
	})
	if err != nil {
		k.t.Fatal(err)
	}
}

// removeSandbox is the kubelet's RemovePodSandbox of sb.
func (k kubelet) removeSandbox(sb string) {
	k.t.Helper()
	if _, err := k.m.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb},
		func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
			return &runtimeapi.RemovePodSandboxResponse{}, nil
		}); err != nil {
		k.t.Fatal(err)
	}
}

// Removing the old sandbox of a pod leaves the backoff curve of the pod's
// live sandbox where it is (item 7 of issue 14): its next restart waits the
// next step of the curve, not the initial delay again.
func TestRemovingOldSandboxKeepsLiveBackoff(t *testing.T) {
	for _, tc := range []struct{ name, rules string }{
		{"Restart", `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`},
		{"RestartAllContainers", `[{"action":"RestartAllContainers","exitCodes":{"operator":"NotIn","values":[0]}}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newFakeRT()
			k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
			ann := map[string]string{RulesAnnotationPrefix + "main": tc.rules}
			exit := func(sb string, want time.Duration) {
				t.Helper()
				p := k.m.pods[sb]
				id := p.Latest["main"]
				rt.exit(id, 1)
				k.status(id)
				if p.Phase != PhaseTerminating || p.Trigger.Delay != want {
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
			if err := k.m.execute(context.Background(), "sb1"); err != nil {
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
