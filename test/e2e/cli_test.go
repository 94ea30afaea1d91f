package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/yaml"
)

// The built binary against the test node: listings parse as JSON and YAML,
// and pods fails clearly (exit 1, the socket named) while the shim is stopped.
func TestCLIAgainstNode(t *testing.T) {
	needNode(t)
	shim := func(args ...string) (string, string, int) {
		var stdout, stderr strings.Builder
		cmd := exec.Command(node.env["SHIM_BIN"], append(args, "--config", node.env["SHIM_CONFIG"])...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	out, stderr, code := shim("pods", "-o", "json")
	var pods struct {
		Pods     []map[string]any `json:"pods"`
		Channels []map[string]any `json:"channels"`
	}
	if err := json.Unmarshal([]byte(out), &pods); code != 0 || err != nil || pods.Pods == nil || pods.Channels == nil {
		t.Fatalf("pods -o json: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	t.Logf("pods -o json: %d pods, %d channels", len(pods.Pods), len(pods.Channels))
	out, stderr, code = shim("checkpoints", "-o", "yaml")
	var cps struct {
		Checkpoints []map[string]any `json:"checkpoints"`
		Skipped     []string         `json:"skipped"`
	}
	if err := yaml.UnmarshalStrict([]byte(out), &cps); code != 0 || err != nil || cps.Checkpoints == nil {
		t.Fatalf("checkpoints -o yaml: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	t.Logf("checkpoints -o yaml: %d checkpoints, %d skipped", len(cps.Checkpoints), len(cps.Skipped))

	keepRunning(t, "cri-shim")
	killPidFile(t, "cri-shim", syscall.SIGTERM)
	out, stderr, code = shim("pods")
	want := "cri-shim: the shim is not reachable at " + node.env["SHIM_SOCK"] + ": "
	if code != 1 || out != "" || !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, "(is it running? systemctl status cri-shim)") {
		t.Fatalf("pods with the shim stopped: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, stderr, want)
	}
	t.Logf("pods with the shim stopped: exit 1, %s", strings.TrimSpace(stderr))
	// checkpoints reads directories: it works offline.
	if _, stderr, code := shim("checkpoints"); code != 0 {
		t.Fatalf("checkpoints with the shim stopped: exit %d, %s", code, stderr)
	}
}
