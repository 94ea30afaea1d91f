package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// terminationPod is a Never pod whose sidecar ignores SIGTERM and has a
// preStop hook that leaves a line in the shared emptyDir, and whose main
// exits 88 on its first run (rule88). main notes /proc/uptime in main.t at
// each start and just before that exit, so the time from the trigger to main
// running again is read inside the pod, the same way under the shim and
// under the native kubelet (which removes the old instances). termination
// is the value of restart.cri-shim.io/termination ("" for none); native
// writes the rule in restartPolicyRules for the kubelet's own feature.
func terminationPod(name, termination string, grace int, native bool) string {
	up := "cat /proc/uptime >> /work/main.t"
	m := genPod(name, "Never", grace, map[string]string{"main": rule88},
		[]ctr{{name: "sidecar", sidecar: true, script: "touch /work/prestop.log; trap '' TERM; while true; do sleep 0.2; done"}},
		[]ctr{{name: "main", script: fmt.Sprintf("%[1]s; if [ $n -le 1 ]; then sleep 1; %[1]s; exit 88; fi; %[2]s", up, loop)}})
	if termination != "" {
		m = strings.Replace(m, "  annotations:\n", "  annotations:\n    restart.cri-shim.io/termination: "+termination+"\n", 1)
	}
	if native {
		m = strings.Replace(m, "  annotations:\n    restart-rules.cri-shim.io/main: '"+rule88+"'\n", "", 1)
		m = strings.Replace(m, "  - name: main\n", "  - name: main\n    restartPolicy: Never\n    restartPolicyRules:\n    - action: RestartAllContainers\n      exitCodes: {operator: In, values: [88]}\n", 1)
	}
	return strings.Replace(m, "    restartPolicy: Always\n",
		"    restartPolicy: Always\n    lifecycle:\n      preStop:\n        exec:\n          command: [\"sh\", \"-c\", \"echo run >> /work/prestop.log\"]\n", 1)
}

// terminationRun is what one restart of terminationPod showed.
type terminationRun struct {
	triggerToRunning time.Duration // main's exit 88 to main's next start, /proc/uptime inside the pod
	kubeletSaw       time.Duration // main's exit 88 to the kubelet reporting main running again (poll of 250 ms)
	sidecarStop      time.Duration // main's exit 88 to the old sidecar's exit, from containerd (-1 when it is gone)
	sidecarExit      int32
	preStops         int
}

func (r terminationRun) String() string {
	side := "old sidecar removed (native)"
	if r.sidecarStop >= 0 {
		side = fmt.Sprintf("old sidecar exited %.2f s after the trigger (exit code %d)", r.sidecarStop.Seconds(), r.sidecarExit)
	}
	return fmt.Sprintf("trigger -> main running %.2f s (kubelet shows it running %.1f s after the trigger); %s; preStop ran %d time(s)",
		r.triggerToRunning.Seconds(), r.kubeletSaw.Seconds(), side, r.preStops)
}

// runTermination places terminationPod in dir and follows its restart.
func runTermination(t *testing.T, dir, name, termination string, grace int, native bool) terminationRun {
	t.Helper()
	placeManifestIn(t, dir, name, terminationPod(name, termination, grace, native))
	waitRunning(t, name, 90*time.Second, 0, "sidecar", "main")
	pod := waitRunning(t, name, time.Duration(grace)*time.Second+90*time.Second, 1, "sidecar", "main")
	seen := time.Now()
	var r terminationRun
	var ups []float64
	eventually(t, 10*time.Second, "main's third uptime line", func() error {
		out, err := tryExec(t, pod, "main", "cat /work/main.t")
		if err != nil {
			return err
		}
		ups = ups[:0]
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				v, err := strconv.ParseFloat(f[0], 64)
				if err != nil {
					return fmt.Errorf("main.t line %q: %v", l, err)
				}
				ups = append(ups, v)
			}
		}
		if len(ups) < 3 {
			return fmt.Errorf("main.t has %d lines: %q", len(ups), out)
		}
		return nil
	})
	r.triggerToRunning = time.Duration((ups[2] - ups[1]) * float64(time.Second))
	// Wall clock and /proc/uptime both count from the trigger: the uptime
	// the kubelet's report was seen at is the last start plus the time since.
	var now float64
	if out, err := tryExec(t, pod, "main", "cat /proc/uptime"); err == nil {
		now, _ = strconv.ParseFloat(strings.Fields(out)[0], 64)
	}
	r.kubeletSaw = time.Duration((now-ups[1])*float64(time.Second)) - time.Since(seen)
	r.preStops = runs(t, pod, "main", "prestop")
	r.sidecarStop = -1
	if !native {
		exit, _ := containerdTimes(t, pod, "main", 0)
		var side time.Time
		side, r.sidecarExit = containerdTimes(t, pod, "sidecar", 0)
		r.sidecarStop = side.Sub(exit)
	}
	return r
}

// containerdTimes reads the finish time and exit code of one instance
// (name, attempt) of pod's containers from containerd.
func containerdTimes(t *testing.T, pod *corev1.Pod, name string, attempt uint32) (time.Time, int32) {
	t.Helper()
	sock := node.env["CONTAINERD_SOCK"]
	ids := strings.Fields(mustCrictl(t, sock, "ps", "-a", "-q", "--name", "^"+name+"$", "--label", "io.kubernetes.pod.name="+pod.Name))
	for _, id := range ids {
		var insp struct {
			Status struct {
				Metadata struct {
					Attempt uint32 `json:"attempt"`
				} `json:"metadata"`
				FinishedAt time.Time `json:"finishedAt"`
				ExitCode   int32     `json:"exitCode"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(mustCrictl(t, sock, "inspect", id)), &insp); err != nil {
			t.Fatal(err)
		}
		if insp.Status.Metadata.Attempt == attempt {
			return insp.Status.FinishedAt, insp.Status.ExitCode
		}
	}
	t.Fatalf("no instance %d of %s among %v", attempt, name, ids)
	return time.Time{}, 0
}

func terminationGrace() int {
	g, err := strconv.Atoi(envOr("CRI_SHIM_TERMINATION_GRACE", "10"))
	if err != nil || g < 3 {
		return 10
	}
	return g
}

// An in-place restart stops a sidecar that ignores SIGTERM as the pod chose:
// graceful (the default) runs its preStop hook and kills it when the grace
// period is over; immediate skips the hook and kills it after upstream's 2 s
// window. CRI_SHIM_TERMINATION_GRACE sets the pod's grace period (10 s).
func TestRestartTermination(t *testing.T) {
	needKubelet(t)
	grace := terminationGrace()
	for _, tc := range []struct{ name, value string }{{"default", ""}, {"graceful", "graceful"}, {"immediate", "immediate"}} {
		t.Run(tc.name, func(t *testing.T) {
			r := runTermination(t, node.env["MANIFESTS"], "term-"+tc.name, tc.value, grace, false)
			t.Logf("termination %s, grace %d s: %s", tc.name, grace, r)
			if r.sidecarExit != 137 {
				t.Errorf("old sidecar exit code %d, want 137: it ignores SIGTERM, only SIGKILL ends it", r.sidecarExit)
			}
			switch tc.value {
			case "immediate":
				if r.triggerToRunning >= 5*time.Second || r.sidecarStop < 2*time.Second || r.sidecarStop >= 5*time.Second || r.preStops != 0 {
					t.Errorf("immediate: want main running within 5 s, the sidecar killed 2 to 5 s after the trigger, no preStop")
				}
			default:
				g := time.Duration(grace) * time.Second
				if r.triggerToRunning < g || r.sidecarStop < g || r.preStops != 1 {
					t.Errorf("graceful: want main running and the sidecar killed no sooner than the %v grace period, preStop run once", g)
				}
			}
		})
	}
}

// The same pod under the kubelet's native RestartAllContainers (gates on, no
// shim), for comparison with immediate: upstream kills without preStop.
func TestRestartTerminationNativeKubelet(t *testing.T) {
	needNode(t)
	needNativeRestartAll(t)
	pauseKubelet(t)
	t.Cleanup(func() { pauseKubelet(t) })
	if err := script("up.sh", "--start", "kubelet-native"); err != nil {
		t.Fatal(err)
	}
	grace := terminationGrace()
	r := runTermination(t, node.env["MANIFESTS_NATIVE"], "term-native", "", grace, true)
	t.Logf("native kubelet, grace %d s: %s", grace, r)
	if r.preStops != 0 {
		t.Errorf("the native kubelet ran the preStop hook %d times; upstream kills without it", r.preStops)
	}
}
