package e2e

import (
	"strings"
	"testing"
)

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
// talking to containerd without the shim, gives the same observable outcome.
// The native kubelet takes the standalone one's place for the test; when it
// ends the native kubelet and its pods go, and the next test that needs the
// standalone kubelet starts it (needKubelet).
func TestNativeKubeletSameOutcome(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	t.Cleanup(func() { pauseKubelet(t) })
	if err := script("up.sh", "--start", "kubelet-native"); err != nil {
		t.Fatal(err)
	}
	o := observeRestarts(t, "native-restart", node.env["MANIFESTS_NATIVE"], restartPodNative("native-restart"))
	checkOutcome(t, o)
	t.Logf("native kubelet (gates on, no shim): init %d, sidecar %d, main restarts %d, sandbox kept, IP %v)",
		o.initRuns, o.sidecarRuns, o.mainRestarts, keys(o.ips))
}
