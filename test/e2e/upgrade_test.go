// The acceptance test of in-place upgrades under crash loops
// (docs/operations.md, "Restart and upgrade").

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// kubeletCRIErrors matches what the kubelet logs when a CRI call to the shim
// fails for want of the shim: the connection refused, reset or closed under a
// call, or the call answered Unavailable.
var kubeletCRIErrors = regexp.MustCompile(`code = Unavailable|connection refused|transport is closing|error reading from server|connection reset`)

// The shim upgraded in place ten times (five in the fast tier; SIGUSR2, what
// `systemctl reload cri-shim` and deploy/install.sh send) while 20 pods (8) with restart rules
// crash-loop at a 1 s node maximum: the kubelet never sees a failed CRI call,
// no pod is failed, and every pod goes on being restarted at that pace. At
// that pace on 2 vCPUs the kubelet removes exited instances more slowly than
// 20 pods make them, and within this test's minute restarts would begin to
// wait for its removals (docs/backoff.md); that wait is not what this test
// pins (the stress bench and backlog_test.go do), so the shim is told the
// kubelet keeps 100 exited instances per container.
func TestUpgradeInPlaceUnderCrashLoops(t *testing.T) {
	needKubelet(t)
	withShimConfig(t, "[backoff]\nmax_container_restart_period = 1\nkubelet_dead_containers_per_container = 100\n")
	// 8 pods and 5 upgrades in the fast tier, 20 and 10 in the long one.
	n, upgrades := sized(8, 20), sized(5, 10)
	var names []string
	for i := range n {
		name := fmt.Sprintf("upgrade-%02d", i)
		names = append(names, name)
		_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
		placeManifest(t, name, crashPod(name))
	}
	eventually(t, 120*time.Second, "every pod crash-looping", func() error {
		for _, name := range names {
			if s, _ := stamps(name); len(s) < 3 {
				return fmt.Errorf("%s started %d times", name, len(s))
			}
		}
		return nil
	})
	kubeletLog := filepath.Join(node.env["NODE_RUN"], "kubelet.log")
	shimLog := filepath.Join(node.env["NODE_RUN"], "cri-shim.log")
	logOffset := func(p string) int64 {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	since := func(p string, off int64) string {
		b, err := os.ReadFile(p)
		if err != nil || int64(len(b)) < off {
			t.Fatalf("read %s: %v", p, err)
		}
		return string(b[off:])
	}
	// The same window without upgrades first: what the kubelet logs anyway.
	baseOff := logOffset(kubeletLog)
	time.Sleep(10 * time.Second)
	baseline := kubeletCRIErrors.FindAllString(since(kubeletLog, baseOff), -1)

	pid := pidOf("cri-shim")
	kOff, sOff := logOffset(kubeletLog), logOffset(shimLog)
	refused0 := refusedTransitions()
	// Kept before the cleanups restart the daemons (which rewrites their logs).
	t.Cleanup(func() {
		if t.Failed() {
			keepLog(t, kubeletLog, kOff, "kubelet")
			keepLog(t, shimLog, sOff, "cri-shim")
		}
	})
	started := map[string]int{}
	for _, name := range names {
		s, _ := stamps(name)
		started[name] = len(s)
	}
	t0 := time.Now()
	for i := range upgrades {
		if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
			t.Fatalf("upgrade %d: %v", i+1, err)
		}
		eventually(t, 30*time.Second, fmt.Sprintf("upgrade %d serving", i+1), func() error {
			log := since(shimLog, sOff)
			if got := strings.Count(log, `"socket":"in-place upgrade"`) + strings.Count(log, `socket="in-place upgrade"`); got < i+1 {
				return fmt.Errorf("%d upgraded runs serving", got)
			}
			_, err := crictl(t, node.env["SHIM_SOCK"], "version")
			return err
		})
		time.Sleep(2 * time.Second)
	}
	window := time.Since(t0)
	if got := pidOf("cri-shim"); got != pid || syscall.Kill(pid, 0) != nil {
		t.Fatalf("the shim's process changed (%d -> %d): an upgrade in place keeps it", pid, got)
	}
	if strings.Contains(since(shimLog, sOff), "in-place upgrade failed") {
		t.Fatalf("an upgrade failed:\n%s", lastLines(since(shimLog, sOff), 30))
	}
	// Every pod still restarting: each started again after the last upgrade.
	time.Sleep(5 * time.Second)
	restarts := 0
	for _, name := range names {
		s, _ := stamps(name)
		restarts += len(s) - started[name]
		if len(s) < started[name]+upgrades/2 {
			t.Errorf("%s started %d times during %v of upgrades (had %d): restarts lost", name, len(s)-started[name], window.Round(time.Second), started[name])
			upgradeDiagnostics(t, name, shimLog, sOff)
		}
	}
	last := map[string]int{}
	for _, name := range names {
		s, _ := stamps(name)
		last[name] = len(s)
	}
	stuck := names
	for deadline := time.Now().Add(20 * time.Second); len(stuck) > 0 && time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var still []string
		for _, name := range stuck {
			if s, _ := stamps(name); len(s) <= last[name] {
				still = append(still, name)
			}
		}
		stuck = still
	}
	for _, name := range stuck {
		t.Errorf("%s not started again in the 20 s after the last upgrade", name)
		upgradeDiagnostics(t, name, shimLog, sOff)
	}
	errs := kubeletCRIErrors.FindAllString(since(kubeletLog, kOff), -1)
	if len(errs) > 0 {
		t.Errorf("%d CRI errors in the kubelet's log during the upgrades (%d in the same time before): %q", len(errs), len(baseline), errs)
	}
	if r := refusedTransitions() - refused0; r != 0 {
		t.Errorf("the kubelet refused %d status updates as illegal transitions", r)
	}
	for _, name := range names {
		p, err := kubeletPod(t, name+"-"+envOr("CRI_SHIM_NODE_NAME", "cri-shim-node"))
		if err == nil && p.Status.Phase == corev1.PodFailed {
			cs, _ := json.Marshal(p.Status.ContainerStatuses)
			t.Errorf("%s failed: %s %s; the kubelet's container statuses: %s", name, p.Status.Reason, p.Status.Message, cs)
			upgradeDiagnostics(t, name, shimLog, sOff)
		}
	}
	t.Logf("%d upgrades in %v under %d crash-looping pods: %d restarts, %d kubelet CRI errors (baseline %d in 10 s), pid %d kept",
		upgrades, window.Round(time.Second), n, restarts, len(errs), len(baseline), pid)
}

// upgradeDiagnostics logs what the runtime, the shim's records and its log
// say of a pod that stopped restarting.
func upgradeDiagnostics(t *testing.T, name, shimLog string, off int64) {
	t.Helper()
	full := fullName(name)
	out, err := crictl(t, node.env["CONTAINERD_SOCK"], "ps", "-a", "--label", "io.kubernetes.pod.name="+full)
	t.Logf("%s: containers in containerd (%v):\n%s", full, err, out)
	b, err := exec.Command(node.env["SHIM_BIN"], "pods", "-o", "json", "--config", filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")).CombinedOutput()
	if err != nil {
		t.Logf("cri-shim pods: %v: %s", err, b)
	}
	var pods struct {
		Pods []map[string]any `json:"pods"`
	}
	if err := json.Unmarshal(b, &pods); err != nil {
		t.Logf("cri-shim pods -o json: %v", err)
	}
	keys := []string{full}
	for _, p := range pods.Pods {
		if fmt.Sprint(p["name"]) == full {
			j, _ := json.Marshal(p)
			t.Logf("cri-shim pods: %s", j)
			if id := fmt.Sprint(p["sandboxId"]); len(id) >= 13 {
				keys = append(keys, id[:13])
			}
		}
	}
	b, _ = os.ReadFile(shimLog)
	if int64(len(b)) > off {
		var lines []string
		for _, l := range strings.Split(string(b[off:]), "\n") {
			match := strings.Contains(l, "upgrading in place") || strings.Contains(l, `"ERROR"`) || strings.Contains(l, `"WARN"`)
			for _, k := range keys {
				match = match || strings.Contains(l, k)
			}
			if match {
				lines = append(lines, l)
			}
		}
		t.Logf("shim log:\n%s", lastLines(strings.Join(lines, "\n"), 60))
	}
}

// keepLog copies what a daemon logged since off to the temporary directory
// (the node's logs are rewritten when the test's cleanup restarts it).
func keepLog(t *testing.T, path string, off int64, what string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) <= off {
		return
	}
	keep := filepath.Join(os.TempDir(), "cri-shim-upgrade-test."+what+".log")
	if os.WriteFile(keep, b[off:], 0o600) == nil {
		t.Logf("the %s log of the upgrades: %s", what, keep)
	}
}
