package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// crashPod: main exits 1 right after starting, every time, and stamps the
// host's /proc/uptime at each start and exit into a hostPath file. Its rule
// opts every failure into the shim's curve (Restart, NotIn [0]); the pod's
// restartPolicy is Never, so without the shim the first exit would fail it.
func crashPod(name string) string {
	dir := filepath.Join(node.env["NODE_DATA"], "bench", name)
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  annotations:
    restart-rules.cri-shim.io/main: '[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]'
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "n=$(cat /t/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > /t/count; echo start $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; echo exit $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; exit 1"]
    volumeMounts: [{name: t, mountPath: /t}]
  volumes:
  - name: t
    hostPath: {path: %[2]s, type: DirectoryOrCreate}
`, name, dir)
}

// withShimConfig restarts the shim with extra TOML appended to its config,
// and restores the original config (and shim) when the test ends.
func withShimConfig(t *testing.T, extra string) {
	t.Helper()
	withShimConfigEdit(t, func(orig []byte) []byte { return append(append([]byte{}, orig...), []byte("\n"+extra)...) })
}

// withShimConfigEdit restarts the shim with its config changed by edit, and
// restores the original config (and shim) when the test ends.
func withShimConfigEdit(t testing.TB, edit func([]byte) []byte) {
	t.Helper()
	restart, orig := shimConfigSwitch(t)
	restart(edit(orig))
}

// shimConfigSwitch returns the shim's config and a function that restarts
// the shim with another; the original config (and shim) is restored when the
// test ends.
func shimConfigSwitch(t testing.TB) (restart func([]byte), orig []byte) {
	t.Helper()
	cfg := filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	restart = func(b []byte) {
		if err := os.WriteFile(cfg, b, 0o644); err != nil {
			t.Fatal(err)
		}
		killPidFile(t, "cri-shim", 15)
		if err := script("up.sh", "--start", "cri-shim"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { restart(orig) })
	return restart, orig
}

// gaps runs crashPod until it has restarted len(want) times and returns the
// measured exit-to-next-start gaps.
func gaps(t *testing.T, name string, n int) []float64 {
	t.Helper()
	_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
	placeManifest(t, name, crashPod(name))
	eventually(t, 400*time.Second, fmt.Sprintf("%s to start %d times", name, n+1), func() error {
		if p, err := kubeletPod(t, fullName(name)); err == nil && p.Status.Phase == corev1.PodFailed {
			t.Fatalf("%s failed: the kubelet saw an exit the shim governs", name)
		}
		starts, _ := stamps(name)
		if _, ok := starts[n+1]; !ok {
			return fmt.Errorf("%d starts", len(starts))
		}
		return nil
	})
	var out []float64
	for _, g := range stampGaps(t, name, n) {
		out = append(out, math.Round(g*100)/100)
	}
	return out
}

// A gap is the delay plus the runtime's create and start of the next
// instance, which the shim does not control: never sooner than the delay
// (less the stamps' own jitter, gapEarly), and at most gapLate later. The
// start took up to 0.69 s with three lanes sharing two cores (CI, c51060c);
// gapLate still fails a curve off by one step (a 2 s gap where 1 s is due
// passes at most once, a 4 s one where 2 s is due does not).
const (
	gapEarly = 0.25
	gapLate  = 1.0
)

func checkGaps(t *testing.T, got, want []float64) {
	t.Helper()
	for i := range want {
		if got[i] < want[i]-gapEarly || got[i] > want[i]+gapLate {
			t.Errorf("gaps %v, want %v: each no sooner than %.2f s early nor %.1f s late", got, want, gapEarly, gapLate)
			return
		}
	}
	t.Logf("gaps %v (want %v, -%.2f/+%.1f s)", got, want, gapEarly, gapLate)
}

// Backoff acceptance 1: default config, gaps 1, 2, 4, 8, 16, 32 s (the first
// four in the fast tier: TestBackoffNodeMax shows the cap, the unit tests of
// internal/backoff the 60 s one).
func TestBackoffDefaultCurve(t *testing.T) {
	needKubelet(t)
	want := sized([]float64{1, 2, 4, 8}, []float64{1, 2, 4, 8, 16, 32})
	checkGaps(t, gaps(t, "backoff-default", len(want)), want)
	if out := shimPodLines(t, fullName("backoff-default")); !strings.Contains(out, fmt.Sprintf("main=%d", len(want))) || !strings.Contains(out, "(Restart)") {
		t.Errorf("cri-shim pods, line of backoff-default:\n%s\nall:\n%s", out, shimPods(t))
	}
}

// Backoff acceptance 2: node max 4 s gives 1, 2, 4, 4, 4; initial 10 s with
// node max 2 s gives 2, 2, 2.
func TestBackoffNodeMax(t *testing.T) {
	needKubelet(t)
	t.Run("max4", func(t *testing.T) {
		withShimConfig(t, "[backoff]\nmax_container_restart_period = 4\n")
		checkGaps(t, gaps(t, "backoff-max4", 5), []float64{1, 2, 4, 4, 4})
	})
	t.Run("initial10max2", func(t *testing.T) {
		withShimConfig(t, "[backoff]\ninitial_delay = \"10s\"\nmax_delay = \"300s\"\nmax_container_restart_period = 2\n")
		checkGaps(t, gaps(t, "backoff-i10m2", 3), []float64{2, 2, 2})
	})
}

// Backoff acceptance 3: a pod that keeps triggering RestartAllContainers has
// its restarts spaced by the same curve. The hold is measured from main's exit
// to the init container's run (the restart's first step after the hold); the
// rest of the restart (stopping the sidecar, creating and starting three
// containers) is reported but bounded only loosely, since it is the runtime's
// work and grows with the machine's load, not the curve.
func TestBackoffSpacesPodRestarts(t *testing.T) {
	needKubelet(t)
	name := "backoff-pod"
	got := inPlaceBlock(t, name, node.env["MANIFESTS"], "annotation", 3)
	_, exits := stamps(name)
	inits := initStarts(name)
	if len(inits) < 4 {
		t.Fatalf("init ran %d times, want 4 (first start and 3 restarts)", len(inits))
	}
	var holds []float64
	for i, want := range []float64{1, 2, 4} {
		hold := math.Round((inits[i+1]-mustStamp(t, name, exits, "exit", i+1))*100) / 100
		holds = append(holds, hold)
		if d := hold - want; d < 0 || d > 0.5 {
			t.Fatalf("exit to restart (hold) %v: want 1, 2, 4 s (+0.5 s); exit to main running %v", holds, got)
		}
		if d := got[i] - want; d < 0 || d > 3 {
			t.Fatalf("exit to main running %v: want 1, 2, 4 s plus the restart's work (under 3 s)", got)
		}
	}
	t.Logf("pod restart holds %v, exit to main running %v", holds, got)
}
