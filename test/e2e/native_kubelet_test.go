package e2e

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// nativeRestartGate is the kubelet's feature gate of its own
// RestartAllContainers action (KEP-5532).
const nativeRestartGate = "RestartAllContainersOnContainerExits"

// needNativeRestartAll skips a test that compares with the kubelet's own
// RestartAllContainers when the node's kubelet has none: kubelet v1.34 has
// no such gate (its pkg/features/kube_features.go), and a kubelet refuses a
// config that names a gate it does not know, so up.sh turns on only the
// native gates the kubelet lists in its --help and writes them to
// KUBELET_NATIVE_GATES. v1.35 has the gate (alpha, off by default): the
// native kubelet turns it on, with the two gates it depends on. From v1.35
// on a missing gate is a fault of the test bed, not a reason to skip.
func needNativeRestartAll(t testing.TB) {
	t.Helper()
	gates := node.env["KUBELET_NATIVE_GATES"]
	if slices.Contains(strings.Split(gates, ","), nativeRestartGate) {
		return
	}
	v := node.env["KUBELET_VERSION"]
	if minor, err := kubeletMinor(v); err == nil && minor < 35 {
		t.Skipf("kubelet %s has no native RestartAllContainers (no %s feature gate): nothing to compare with", v, nativeRestartGate)
	}
	t.Fatalf("kubelet %s: up.sh found no %s gate (KUBELET_NATIVE_GATES=%q); it has one from v1.35 on", v, nativeRestartGate, gates)
}

// kubeletMinor is the minor version of a kubelet version such as 1.34.4.
func kubeletMinor(v string) (int, error) {
	parts := strings.Split(strings.TrimPrefix(v, "v"), ".")
	if len(parts) < 2 {
		return 0, strconv.ErrSyntax
	}
	return strconv.Atoi(parts[1])
}

// restartPodNative is the acceptance-1 workload written for the kubelet's
// native feature: the rule in restartPolicyRules instead of the annotation.
func restartPodNative(name string) string {
	m := restartPod(name, 88, 2, rule88)
	m = strings.Replace(m, "  annotations:\n    restart-rules.cri-shim.io/main: '"+rule88+"'\n", "", 1)
	return strings.Replace(m, "  - name: main\n", `  - name: main
    restartPolicy: Never
    restartPolicyRules:
    - action: RestartAllContainers
      exitCodes: {operator: In, values: [88]}
`, 1)
}

// Acceptance 7: the same workload on a kubelet with the native gates on,
// talking to containerd without the shim, gives the same observable outcome
// (on v1.35, all but main's last termination state, which its alpha feature
// drops; v1.34 has no native feature to compare with).
// The native kubelet takes the standalone one's place for the test; when it
// ends the native kubelet and its pods go, and the next test that needs the
// standalone kubelet starts it (needKubelet).
func TestNativeKubeletSameOutcome(t *testing.T) {
	needNode(t)
	needNativeRestartAll(t)
	pauseKubelet(t)
	t.Cleanup(func() { pauseKubelet(t) })
	if err := script("up.sh", "--start", "kubelet-native"); err != nil {
		t.Fatal(err)
	}
	o := observeRestarts(t, "native-restart", node.env["MANIFESTS_NATIVE"], restartPodNative("native-restart"))
	// Kubelet v1.35's alpha RestartAllContainers removes the old containers
	// with their logs and keeps nothing of their end: main has no last
	// termination state (its pkg/kubelet/kuberuntime/kuberuntime_manager.go,
	// SyncPod, removeContainer without keepLogs; pkg/kubelet/kubelet_pods.go,
	// convertToAPIContainerStatuses, which from v1.36 on carries the old
	// state into LastTerminationState). The shim keeps it on every kubelet
	// (TestInPlaceRestartAllContainers). The rest of the outcome is the same.
	if minor, _ := kubeletMinor(node.env["KUBELET_VERSION"]); minor == 35 {
		if o.lastTermination {
			t.Errorf("kubelet %s's native restart gave main a last termination state: its v1.35 source does not; update this test", node.env["KUBELET_VERSION"])
		}
		t.Logf("kubelet %s's native restart leaves main no last termination state (as its source says); the shim's keeps it", node.env["KUBELET_VERSION"])
		o.lastTermination = true // checked above; checkOutcome checks the rest
	}
	checkOutcome(t, o)
	t.Logf("native kubelet (gates on, no shim): init %d, sidecar %d, main restarts %d, sandbox kept, IP %v)",
		o.initRuns, o.sidecarRuns, o.mainRestarts, keys(o.ips))
}
