package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// restartPod is a static pod with restartPolicy Never whose main container
// exits `code` on its first `fails` runs (counted in an emptyDir, which an
// in-place restart keeps) and then stays up. The init container and the sidecar
// append a line per run, so the test can count how often each ran.
func restartPod(name string, code, fails int, rule string) string {
	return genPod(name, "Never", 2, map[string]string{"main": rule},
		[]ctr{{name: "init", script: "true"}, {name: "sidecar", sidecar: true, script: loop}},
		[]ctr{{name: "main", script: fmt.Sprintf("echo main run $n; if [ $n -le %d ]; then sleep 1; exit %d; fi; %s", fails, code, loop)}})
}

const rule88 = `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]`

func placeManifest(t testing.TB, name, body string) {
	t.Helper()
	placeManifestIn(t, node.env["MANIFESTS"], name, body)
}

// placeManifestIn places a static pod in a kubelet's manifest directory
// until the test ends.
func placeManifestIn(t testing.TB, dir, name, body string) {
	t.Helper()
	p := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(p) })
	// Runs before the removal: what the kubelet and the shim said about a
	// pod of a failed test, while it is still there.
	t.Cleanup(func() {
		if t.Failed() {
			logAbout(t, name, 40)
		}
	})
}

func statusOf(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if cs.Name == name {
			return &cs
		}
	}
	return nil
}

// execIn runs a command in a container through the kubelet, failing the
// test if the exec fails.
func execIn(t testing.TB, pod *corev1.Pod, container, cmd string) string {
	t.Helper()
	out, err := tryExec(t, pod, container, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryExec is execIn for polling loops: it returns the exec's error.
func tryExec(t testing.TB, pod *corev1.Pod, container, cmd string) (string, error) {
	out, err := kubeletDo(t, http.MethodPost, fmt.Sprintf("/run/%s/%s/%s?cmd=%s", pod.Namespace, pod.Name, container, strings.ReplaceAll(cmd, " ", "+")))
	if err != nil {
		return "", fmt.Errorf("exec %q in %s: %w", cmd, container, err)
	}
	return out, nil
}

// lastStateWithin is how soon after main shows running again the kubelet
// records the replaced instance's end as main's last state: the hold's read
// window (5 s) and a relist.
const lastStateWithin = 10 * time.Second

// restartOutcome is what a user can observe of the acceptance-1 workload.
type restartOutcome struct {
	sandboxes, ips        map[string]bool
	initRuns, sidecarRuns int
	mainRestarts          int32
	lastTermination       bool
	triggerToRunning      []time.Duration
	phase                 corev1.PodPhase
}

// observeRestarts places the acceptance-1 workload in dir and follows it
// until main runs after two restarts, failing if the pod ever turns terminal.
func observeRestarts(t testing.TB, name, dir, manifest string) restartOutcome {
	t.Helper()
	p := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(p, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(p) })
	full := fullName(name)
	o := restartOutcome{sandboxes: map[string]bool{}, ips: map[string]bool{}}
	deadline := time.Now().Add(120 * time.Second)
	for {
		pod, err := kubeletPod(t, full)
		if err == nil {
			if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
				t.Fatalf("pod reached %s: a triggering exit was taken as final\n%+v", pod.Status.Phase, pod.Status.ContainerStatuses)
			}
			if pod.Status.PodIP != "" {
				o.ips[pod.Status.PodIP] = true
			}
			if out, err := crictl(t, node.env["CONTAINERD_SOCK"], "pods", "--name", name, "-q"); err == nil {
				for _, id := range strings.Fields(out) {
					o.sandboxes[id] = true
				}
			}
			if m := statusOf(pod, "main"); m != nil {
				if m.RestartCount >= 2 && m.State.Running != nil && pod.Status.Phase == corev1.PodRunning {
					o.mainRestarts = m.RestartCount
					o.phase = pod.Status.Phase
					// The replaced instance reads running for a moment after
					// the swap, until no read of the pod can belong to a list
					// from before it (docs/in-place-restart.md); then the
					// kubelet records its end as main's last state.
					deadline := time.Now().Add(lastStateWithin)
					for m != nil && m.LastTerminationState.Terminated == nil && time.Now().Before(deadline) {
						time.Sleep(200 * time.Millisecond)
						if p, err := kubeletPod(t, full); err == nil {
							m = statusOf(p, "main")
						}
					}
					o.lastTermination = m != nil && m.LastTerminationState.Terminated != nil
					eventually(t, 10*time.Second, "the sidecar's third start", func() error {
						n, err := tryRunsOf(t, pod, "main", "init", "sidecar")
						if err != nil {
							return err
						}
						o.initRuns, o.sidecarRuns = n[0], n[1]
						if o.sidecarRuns < 3 {
							return fmt.Errorf("sidecar started %d times", o.sidecarRuns)
						}
						return nil
					})
					return o
				}
			}
		}
		if time.Now().After(deadline) {
			pod, _ := kubeletPod(t, full)
			t.Fatalf("main never reached 2 restarts running; last status %+v", pod)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func checkOutcome(t testing.TB, o restartOutcome) {
	t.Helper()
	if len(o.sandboxes) != 1 {
		t.Errorf("sandbox changed: %v", o.sandboxes)
	}
	if len(o.ips) != 1 {
		t.Errorf("pod IP changed: %v", o.ips)
	}
	if o.initRuns != 3 || o.sidecarRuns != 3 || o.mainRestarts != 2 || o.phase != corev1.PodRunning {
		t.Errorf("init ran %d, sidecar started %d, main restarts %d, phase %s; want 3, 3, 2, Running", o.initRuns, o.sidecarRuns, o.mainRestarts, o.phase)
	}
	if !o.lastTermination {
		t.Errorf("main has no last termination state: kubectl logs --previous would not find the run before")
	}
}

// Acceptance 1 of the in-place restart issue: main exits 88 twice, then runs,
// through the shim with the kubelet's native gates off.
func TestInPlaceRestartAllContainers(t *testing.T) {
	needKubelet(t)
	restarts0 := max(metricValue(scrapeMetrics(t), "cri_shim_pod_restarts_total"), 0)
	o := observeRestarts(t, "restart-all", node.env["MANIFESTS"], restartPod("restart-all", 88, 2, rule88))
	checkOutcome(t, o)
	// kubectl logs --previous: the kubelet serves the previous instance's log.
	prev, err := kubeletDo(t, http.MethodGet, "/containerLogs/default/"+fullName("restart-all")+"/main?previous=true")
	if err != nil || !strings.Contains(prev, "main run 2") {
		t.Errorf("previous logs of main: %q %v", prev, err)
	}
	if out := shimPodLines(t, fullName("restart-all")); !strings.Contains(out, "main exit 88 (RestartAllContainers)") {
		t.Errorf("cri-shim pods does not show the restarted pod on its line:\n%s", shimPods(t))
	}
	// The counter is per shim process and shared with the suite's other pods:
	// this pod's 2 restarts must show in its increase.
	if v := metricValue(scrapeMetrics(t), "cri_shim_pod_restarts_total"); v-restarts0 < 2 {
		t.Errorf("cri_shim_pod_restarts_total went from %v to %v, want this pod's 2 restarts counted", restarts0, v)
	}
	t.Logf("through cri-shim: init %d, sidecar %d, main restarts %d, sandbox kept, IP %v)", o.initRuns, o.sidecarRuns, o.mainRestarts, keys(o.ips))
}

// Acceptance 5: a main container that exits 1 (no matching rule) under
// restartPolicy Never fails the pod exactly as without the shim.
func TestNonMatchingExitFailsPod(t *testing.T) {
	needKubelet(t)
	name := "no-match"
	placeManifest(t, name, restartPod(name, 1, 1, rule88))
	full := name + "-" + envOr("CRI_SHIM_NODE_NAME", "cri-shim-node")
	eventually(t, 90*time.Second, "the pod to fail", func() error {
		p, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		if m := statusOf(p, "main"); m == nil || m.State.Terminated == nil || m.State.Terminated.ExitCode != 1 || m.RestartCount != 0 {
			return fmt.Errorf("main status %+v", m)
		}
		return nil
	})
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(b), n)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
