package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// benchPod is the acceptance-1 pod for timing: init, sidecar and main share a
// hostPath directory where main stamps the host's /proc/uptime (one clock for
// every container and the host, 10 ms resolution) when it starts and right
// before each exit 88. rule: "annotation", "native" or "" (no rule).
func benchPod(name string, exits int, rule string) string {
	dir := filepath.Join(node.env["NODE_DATA"], "bench", name)
	m := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
ANNOTATIONS
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: init
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "echo init $(cut -d' ' -f1 /proc/uptime) >> /t/init.log"]
    volumeMounts: [{name: t, mountPath: /t}]
  - name: sidecar
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    restartPolicy: Always
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts: [{name: t, mountPath: /t}]
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
RULES    command: ["sh", "-c", "n=$(cat /t/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > /t/count; echo start $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; if [ $n -le %[2]d ]; then sleep 1; echo exit $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; exit 88; fi; trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts: [{name: t, mountPath: /t}]
  volumes:
  - name: t
    hostPath: {path: %[3]s, type: DirectoryOrCreate}
`, name, exits, dir)
	ann, rules := "", ""
	switch rule {
	case "annotation":
		ann = "  annotations:\n    restart-rules.cri-shim.io/main: '" + rule88 + "'"
	case "native":
		rules = "    restartPolicy: Never\n    restartPolicyRules:\n    - action: RestartAllContainers\n      exitCodes: {operator: In, values: [88]}\n"
	}
	m = strings.Replace(m, "ANNOTATIONS\n", ann+"\n", 1)
	return strings.Replace(m, "RULES", rules, 1)
}

// stamps reads "start N t" / "exit N t" lines of a bench pod (a line cut
// short or garbled is left out, so it reads as missing, never as 0).
func stamps(name string) (starts, exits map[int]float64) {
	starts, exits = map[int]float64{}, map[int]float64{}
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_DATA"], "bench", name, "t.log"))
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "start" && f[0] != "exit" {
			continue
		}
		n, nerr := strconv.Atoi(f[1])
		v, verr := strconv.ParseFloat(f[2], 64)
		if nerr != nil || verr != nil {
			continue
		}
		if f[0] == "start" {
			starts[n] = v
		} else {
			exits[n] = v
		}
	}
	return starts, exits
}

// mustStamp is run i's stamp of the given kind ("start" or "exit") from m;
// a missing one fails the test, naming it. Read as 0 it made a gap of the
// host's whole uptime (a 41,761 s "gap" in a stored run).
func mustStamp(t testing.TB, name string, m map[int]float64, kind string, i int) float64 {
	t.Helper()
	v, ok := m[i]
	if !ok {
		b, _ := os.ReadFile(filepath.Join(node.env["NODE_DATA"], "bench", name, "t.log"))
		t.Fatalf("%s: no %s stamp of run %d; t.log:\n%s", name, kind, i, b)
	}
	return v
}

// stampGaps returns, for runs 1..n of a bench pod, the time from run i's
// exit stamp to run i+1's start stamp; each stamp must be there.
func stampGaps(t testing.TB, name string, n int) []float64 {
	t.Helper()
	starts, exits := stamps(name)
	out := make([]float64, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, mustStamp(t, name, starts, "start", i+1)-mustStamp(t, name, exits, "exit", i))
	}
	return out
}

// initStarts returns the times the pod's init container ran, in order: the
// first step of each in-place restart once its hold is over.
func initStarts(name string) []float64 {
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_DATA"], "bench", name, "init.log"))
	var out []float64
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "init" {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out = append(out, v)
			}
		}
	}
	return out
}

func hostUptime() float64 {
	b, _ := os.ReadFile("/proc/uptime")
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}

// inPlaceBlock runs one pod through k in-place restarts and returns the time
// from each exit 88 to main running again (init and sidecar re-ran before it).
func inPlaceBlock(t testing.TB, name, dir, rule string, k int) []float64 {
	t.Helper()
	_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
	p := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(p, []byte(benchPod(name, k, rule)), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	eventually(t, time.Duration(k)*40*time.Second, name+" to finish its restarts", func() error {
		starts, _ := stamps(name)
		if _, ok := starts[k+1]; !ok {
			if pod, err := kubeletPod(t, fullName(name)); err == nil && pod.Status.Phase == corev1.PodFailed {
				t.Fatalf("%s failed", name)
			}
			return fmt.Errorf("%d starts so far", len(starts))
		}
		return nil
	})
	return stampGaps(t, name, k)
}

// recreateBlock: main exits 88 with no rule, the pod fails, and a controller
// (this loop) deletes it and creates a new one: from the exit to the new main running.
func recreateBlock(t testing.TB, base string, k int) []float64 {
	t.Helper()
	var out []float64
	for i := 1; i <= k; i++ {
		name := fmt.Sprintf("%s-%d", base, i)
		_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
		p := filepath.Join(node.env["MANIFESTS"], name+".yaml")
		if err := os.WriteFile(p, []byte(benchPod(name, 1, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, name+" to fail", func() error {
			pod, err := kubeletPod(t, fullName(name))
			if err != nil {
				return err
			}
			if pod.Status.Phase != corev1.PodFailed {
				return fmt.Errorf("phase %s", pod.Status.Phase)
			}
			return nil
		})
		_, exits := stamps(name)
		exitAt := mustStamp(t, name, exits, "exit", 1)
		_ = os.Remove(p)
		next := name + "-new"
		_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", next))
		np := filepath.Join(node.env["MANIFESTS"], next+".yaml")
		if err := os.WriteFile(np, []byte(benchPod(next, 0, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, next+" to run", func() error {
			if starts, _ := stamps(next); len(starts) == 0 {
				return fmt.Errorf("not started")
			}
			return nil
		})
		starts, _ := stamps(next)
		out = append(out, mustStamp(t, next, starts, "start", 1)-exitAt)
		_ = os.Remove(np)
	}
	return out
}

func switchKubelet(t testing.TB, native bool) {
	t.Helper()
	killPidFile(t, "kubelet", 15)
	clearRuntime(t)
	which := "kubelet"
	if native {
		which = "kubelet-native"
	}
	if err := script("up.sh", "--start", which); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRestart (make bench-restart): trigger-to-all-running latency of the
// acceptance-1 pod through cri-shim (native gates off), with the native
// kubelet feature (gates on, no shim), and by deleting and recreating the pod,
// in alternating blocks within one run. The shim runs with
// backoff.max_container_restart_period = 1 so that each of its restarts waits
// the KEP-4603 floor of 1 s rather than a growing delay; that second is
// included in its figures.
func BenchmarkRestart(b *testing.B) {
	if !node.up {
		b.Skip("SKIPPED: needs root and the real node stack")
	}
	cfg := filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(orig, []byte("\n[backoff]\nmax_container_restart_period = 1\n")...), 0o644); err != nil {
		b.Fatal(err)
	}
	defer os.WriteFile(cfg, orig, 0o644)
	killPidFile(b, "cri-shim", 15)
	if err := script("up.sh", "--start", "cri-shim"); err != nil {
		b.Fatal(err)
	}
	const rounds, perBlock = 2, 5
	res := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		switchKubelet(b, false)
		res["cri-shim (gates off)"] = append(res["cri-shim (gates off)"], inPlaceBlock(b, fmt.Sprintf("bench-shim-%d", r), node.env["MANIFESTS"], "annotation", perBlock)...)
		res["recreate pod"] = append(res["recreate pod"], recreateBlock(b, fmt.Sprintf("bench-recreate-%d", r), perBlock)...)
		switchKubelet(b, true)
		res["native kubelet (gates on)"] = append(res["native kubelet (gates on)"], inPlaceBlock(b, fmt.Sprintf("bench-native-%d", r), node.env["MANIFESTS_NATIVE"], "native", perBlock)...)
	}
	switchKubelet(b, false)
	writeRestartResults(b, res)
	b.ReportMetric(median(res["cri-shim (gates off)"]), "shim-s/restart")
	b.ReportMetric(median(res["native kubelet (gates on)"]), "native-s/restart")
	b.ReportMetric(median(res["recreate pod"]), "recreate-s/restart")
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func writeRestartResults(b *testing.B, res map[string][]float64) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# In-place pod restart latency\n\n%s. Exit 88 of main to main running again (init and sidecar re-ran first), host /proc/uptime stamps (10 ms). Blocks of 5 alternate; 10 restarts per side.\ncri-shim runs with backoff.max_container_restart_period = 1, so each of its restarts includes the 1 s KEP-4603 floor.\n\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&sb, "| side | n | median s | mean s | min s | max s |\n|---|---:|---:|---:|---:|---:|\n")
	for _, side := range []string{"cri-shim (gates off)", "native kubelet (gates on)", "recreate pod"} {
		v := res[side]
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		var sum float64
		for _, x := range s {
			sum += x
		}
		if len(s) == 0 {
			continue
		}
		fmt.Fprintf(&sb, "| %s | %d | %.2f | %.2f | %.2f | %.2f |\n", side, len(s), median(s), sum/float64(len(s)), s[0], s[len(s)-1])
	}
	shim := median(res["cri-shim (gates off)"])
	if shim > 0 {
		fmt.Fprintf(&sb, "\nnative / cri-shim: %.2fx; recreate / cri-shim: %.2fx (medians; targets 2x and 5x).\n",
			median(res["native kubelet (gates on)"])/shim, median(res["recreate pod"])/shim)
	}
	md := sb.String()
	fmt.Print("\n" + md)
	dir := filepath.Join(node.repo, "bench", "results")
	_ = os.MkdirAll(dir, 0o755)
	_ = os.WriteFile(filepath.Join(dir, "restart-latest.md"), []byte(md), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "restart-"+time.Now().UTC().Format("20060102-150405")+".md"), []byte(md), 0o644)
}
