package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/restartrecord"

	corev1 "k8s.io/api/core/v1"
)

// ctr is one container of a generated test pod. Script runs with $n set to
// how many times this container has run (counted in the shared emptyDir).
type ctr struct {
	name, script string
	sidecar      bool
}

const loop = "trap 'exit 0' TERM; while true; do sleep 0.2; done"

func genPod(name, policy string, grace int, rules map[string]string, inits, mains []ctr) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: default\n  annotations:\n", name)
	for c, r := range rules {
		fmt.Fprintf(&b, "    restart-rules.cri-shim.io/%s: '%s'\n", c, r)
	}
	fmt.Fprintf(&b, "spec:\n  restartPolicy: %s\n  terminationGracePeriodSeconds: %d\n", policy, grace)
	write := func(key string, cs []ctr) {
		if len(cs) == 0 {
			return
		}
		fmt.Fprintf(&b, "  %s:\n", key)
		for _, c := range cs {
			script := fmt.Sprintf("n=$(cat /work/%[1]s.count 2>/dev/null || echo 0); n=$((n+1)); echo $n > /work/%[1]s.count; echo run >> /work/%[1]s.log; %[2]s", c.name, c.script)
			q, _ := json.Marshal(script)
			fmt.Fprintf(&b, "  - name: %s\n    image: docker.io/library/busybox:cri-shim\n    imagePullPolicy: Never\n", c.name)
			if c.sidecar {
				b.WriteString("    restartPolicy: Always\n")
			}
			fmt.Fprintf(&b, "    command: [\"sh\", \"-c\", %s]\n    volumeMounts: [{name: work, mountPath: /work}]\n", q)
		}
	}
	write("initContainers", inits)
	write("containers", mains)
	b.WriteString("  volumes:\n  - name: work\n    emptyDir: {}\n")
	return b.String()
}

func fullName(name string) string { return name + "-" + envOr("CRI_SHIM_NODE_NAME", "cri-shim-node") }

// runs reads how often a container ran, through the kubelet's exec, failing
// the test if the exec fails.
func runs(t testing.TB, p *corev1.Pod, via, container string) int {
	t.Helper()
	n, err := tryRuns(t, p, via, container)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tryRuns is runs for polling loops: the exec fails while the container it
// goes through is being restarted (the kubelet answers "container not
// found"), which a loop waiting for a restart to finish must retry.
func tryRuns(t testing.TB, p *corev1.Pod, via, container string) (int, error) {
	out, err := tryExec(t, p, via, "cat /work/"+container+".log")
	return strings.Count(out, "run"), err
}

// tryRunsOf reads several containers' run counts through one container.
func tryRunsOf(t testing.TB, p *corev1.Pod, via string, containers ...string) ([]int, error) {
	out := make([]int, len(containers))
	for i, c := range containers {
		n, err := tryRuns(t, p, via, c)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// waitRunning waits until the kubelet reports the pod Running with every
// listed container running, failing at once if it ever reports Failed.
func waitRunning(t testing.TB, name string, timeout time.Duration, mainRestarts int32, containers ...string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	defer func() {
		if pod == nil {
			logAbout(t, name, 30)
		}
	}()
	eventually(t, timeout, name+" running", func() error {
		p, err := kubeletPod(t, fullName(name))
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("%s failed: %+v", name, p.Status)
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		for _, c := range containers {
			if s := statusOf(p, c); s == nil || s.State.Running == nil {
				return fmt.Errorf("%s not running", c)
			}
		}
		if s := statusOf(p, "main"); s == nil || s.RestartCount < mainRestarts {
			return fmt.Errorf("main restarted %v times, waiting for %d", s, mainRestarts)
		}
		pod = p
		return nil
	})
	return pod
}

// Acceptance 2: the sidecar carries the rule and exits 88 before the main
// container has started: all restart.
func TestInPlaceRestartFromSidecar(t *testing.T) {
	needKubelet(t)
	name := "restart-sidecar"
	placeManifest(t, name, genPod(name, "Never", 2, map[string]string{"sidecar": rule88},
		[]ctr{{name: "init", script: "true"}, {name: "sidecar", sidecar: true, script: "if [ $n -le 1 ]; then exit 88; fi; " + loop}},
		[]ctr{{name: "main", script: loop}}))
	// The kubelet starts main as soon as the sidecar runs (no startup probe),
	// so main may have started before the sidecar's exit: 0 or 1 restarts.
	p := waitRunning(t, name, 90*time.Second, 0, "sidecar", "main")
	eventually(t, 30*time.Second, "counts", func() error {
		n, err := tryRunsOf(t, p, "main", "init", "sidecar")
		if err != nil {
			return err
		}
		if n[0] != 2 || n[1] != 2 {
			return fmt.Errorf("init ran %d, sidecar %d; want 2 and 2", n[0], n[1])
		}
		return nil
	})
	if m := runs(t, p, "main", "main"); m < 1 || m > 2 {
		t.Errorf("main ran %d times, want 1 or 2", m)
	}
}

// Acceptance 3: the 2nd init container carries the rule and exits 88: all restart.
func TestInPlaceRestartFromSecondInit(t *testing.T) {
	needKubelet(t)
	name := "restart-init2"
	placeManifest(t, name, genPod(name, "Never", 2, map[string]string{"init2": rule88},
		[]ctr{{name: "init1", script: "true"}, {name: "init2", script: "if [ $n -le 1 ]; then exit 88; fi"}, {name: "sidecar", sidecar: true, script: loop}},
		[]ctr{{name: "main", script: loop}}))
	p := waitRunning(t, name, 90*time.Second, 0, "sidecar", "main")
	eventually(t, 30*time.Second, "counts", func() error {
		n, err := tryRunsOf(t, p, "main", "init1", "init2")
		if err != nil {
			return err
		}
		if n[0] != 2 || n[1] != 2 {
			return fmt.Errorf("init1 ran %d, init2 %d; want 2 and 2", n[0], n[1])
		}
		return nil
	})
}

// Acceptance 4: after a restart an init container fails. Never: the pod fails.
// Always: the kubelet retries the init container and the pod comes up.
func TestInitFailsAfterRestart(t *testing.T) {
	needKubelet(t)
	for _, policy := range []string{"Never", "Always"} {
		t.Run(policy, func(t *testing.T) {
			name := "init-fails-" + strings.ToLower(policy)
			placeManifest(t, name, genPod(name, policy, 2, map[string]string{"main": rule88},
				[]ctr{{name: "init", script: "if [ $n -eq 2 ]; then exit 1; fi"}},
				[]ctr{{name: "main", script: "if [ $n -le 1 ]; then sleep 1; exit 88; fi; " + loop}}))
			if policy == "Always" {
				p := waitRunning(t, name, 120*time.Second, 1, "main")
				if i := runs(t, p, "main", "init"); i != 3 {
					t.Errorf("init ran %d times, want 3 (ok, failed, retried)", i)
				}
				return
			}
			eventually(t, 90*time.Second, name+" failed", func() error {
				p, err := kubeletPod(t, fullName(name))
				if err != nil {
					return err
				}
				if p.Status.Phase != corev1.PodFailed {
					return fmt.Errorf("phase %s", p.Status.Phase)
				}
				if s := statusOf(p, "init"); s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 1 {
					return fmt.Errorf("init status %+v", s)
				}
				return nil
			})
		})
	}
}

// Acceptance 6: kill -9 the shim while a restart is in TerminatingForRestart
// and while it is in Startup: the restart completes, nothing is left stopped,
// the pod is never marked Failed, at most one extra restart.
func TestKill9DuringRestart(t *testing.T) {
	needKubelet(t)
	for _, tc := range []struct {
		phase  string
		inits  []ctr
		mains  []ctr
		grace  int
		victim string
	}{
		// The sidecar ignores SIGTERM (PID 1 without a handler), so stopping it takes the 6 s grace period.
		{"TerminatingForRestart", []ctr{{name: "init", script: "true"}, {name: "sidecar", sidecar: true, script: "while true; do sleep 0.2; done"}},
			[]ctr{{name: "main", script: "if [ $n -le 1 ]; then sleep 1; exit 88; fi; " + loop}}, 6, "cri-shim"},
		// The init container takes 5 s on its second run, so Startup lasts that long.
		{"Startup", []ctr{{name: "init", script: "if [ $n -eq 2 ]; then sleep 5; fi"}, {name: "sidecar", sidecar: true, script: loop}},
			[]ctr{{name: "main", script: "if [ $n -le 1 ]; then sleep 1; exit 88; fi; " + loop}}, 2, "cri-shim"},
		// The kubelet killed -9 and restarted in the middle of a restart.
		{"TerminatingForRestart", []ctr{{name: "init", script: "true"}, {name: "sidecar", sidecar: true, script: "while true; do sleep 0.2; done"}},
			[]ctr{{name: "main", script: "if [ $n -le 1 ]; then sleep 1; exit 88; fi; " + loop}}, 6, "kubelet"},
	} {
		t.Run(tc.victim+"/"+tc.phase, func(t *testing.T) {
			name := "kill9-" + tc.victim[:4] + "-" + strings.ToLower(tc.phase[:5])
			placeManifest(t, name, genPod(name, "Never", tc.grace, map[string]string{"main": rule88}, tc.inits, tc.mains))
			var sandbox string
			eventually(t, 90*time.Second, "the restart to reach "+tc.phase, func() error {
				out, err := crictl(t, node.env["CONTAINERD_SOCK"], "pods", "--name", name, "-q")
				if err != nil || strings.TrimSpace(out) == "" {
					return fmt.Errorf("no sandbox yet")
				}
				sandbox = strings.Fields(out)[0]
				pods, err := restartrecord.ReadPods(filepath.Join(node.env["NODE_DATA"], "cri-shim"))
				if err != nil {
					return err
				}
				for _, p := range pods {
					if p.SandboxID == sandbox {
						if string(p.Phase) != tc.phase {
							return fmt.Errorf("phase %s", p.Phase)
						}
						return nil
					}
				}
				return fmt.Errorf("no state for sandbox %s", sandbox)
			})
			keepRunning(t, tc.victim)
			killPidFile(t, tc.victim, 9)
			time.Sleep(500 * time.Millisecond)
			if err := script("up.sh", "--start", tc.victim); err != nil {
				t.Fatal(err)
			}
			p := waitRunning(t, name, 90*time.Second, 1, "sidecar", "main")
			if m := statusOf(p, "main"); m.RestartCount < 1 || m.RestartCount > 2 {
				t.Errorf("main restart count %d, want 1 (2 at most)", m.RestartCount)
			}
			if i := runs(t, p, "main", "init"); i < 2 || i > 3 {
				t.Errorf("init ran %d times, want 2 (3 at most)", i)
			}
			out := mustCrictl(t, node.env["CONTAINERD_SOCK"], "ps", "--pod", sandbox, "--state", "running", "-q")
			if n := len(strings.Fields(out)); n != 2 {
				t.Errorf("%d containers running in the sandbox, want 2 (sidecar, main)", n)
			}
		})
	}
}

// killPidFile signals the daemon in $NODE_RUN/NAME.pid and waits for it to exit.
func killPidFile(t testing.TB, name string, sig syscall.Signal) {
	t.Helper()
	f := filepath.Join(node.env["NODE_RUN"], name+".pid")
	b, err := os.ReadFile(f)
	if err != nil {
		return
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	if err := syscall.Kill(pid, sig); err != nil {
		t.Logf("kill %s: %v", name, err)
	}
	for i := 0; i < 500 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = os.Remove(f)
}

func shimPods(t testing.TB) string {
	t.Helper()
	out, err := exec.Command(node.env["SHIM_BIN"], "pods", "--config", filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")).CombinedOutput()
	if err != nil {
		t.Fatalf("cri-shim pods: %v\n%s", err, out)
	}
	return string(out)
}

// shimPodLines returns the lines of `cri-shim pods` about the pod named
// full (one per sandbox), so that a check cannot match another pod's line.
func shimPodLines(t testing.TB, full string) string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(shimPods(t), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasSuffix(f[0], "/"+full) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Malformed or unknown rules: the pod runs with the kubelet's own behaviour,
// and the problem shows in the log, the metrics and `cri-shim pods`.
func TestMalformedRulesRunPlain(t *testing.T) {
	needKubelet(t)
	problems0 := max(metricValue(scrapeMetrics(t), "cri_shim_restart_rule_problems_total"), 0)
	name := "bad-rules"
	placeManifest(t, name, genPod(name, "Never", 2,
		map[string]string{"main": `[{"action":"Explode","exitCodes":{"operator":"In","values":[88]}}]`, "sidecar": `[{`},
		[]ctr{{name: "sidecar", sidecar: true, script: loop}},
		[]ctr{{name: "main", script: loop}}))
	waitRunning(t, name, 90*time.Second, 0, "sidecar", "main")
	out := shimPodLines(t, fullName(name))
	if !strings.Contains(out, `unknown action "Explode"`) || !strings.Contains(out, "not a JSON list") {
		t.Errorf("cri-shim pods does not report the annotation problems on its line:\n%s", shimPods(t))
	}
	if v := metricValue(scrapeMetrics(t), "cri_shim_restart_rule_problems_total"); v-problems0 < 2 {
		t.Errorf("cri_shim_restart_rule_problems_total went from %v to %v, want this pod's 2 problems counted", problems0, v)
	}
}

// metricValue reads an unlabelled sample from Prometheus text output (-1 if absent).
func metricValue(all, name string) float64 {
	for _, l := range strings.Split(all, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}
