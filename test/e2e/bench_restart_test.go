package e2e

import (
	"bytes"
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
    command: ["sh", "-c", "echo sidecar $(cut -d' ' -f1 /proc/uptime) >> /t/sidecar.log; trap 'exit 0' TERM; while true; do sleep 0.2; done"]
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
func initStarts(name string) []float64 { return runStamps(name, "init") }

// runStamps returns the times the pod's container (init or sidecar) ran,
// in order, from its "<container> <uptime>" lines in /t/<container>.log.
func runStamps(name, container string) []float64 {
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_DATA"], "bench", name, container+".log"))
	var out []float64
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == container {
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
	defer runInPlace(t, name, dir, rule, k)()
	return stampGaps(t, name, k)
}

// runInPlace starts bench pod name and waits until main has run again
// after each of its k exits; the pod runs until remove is called.
func runInPlace(t testing.TB, name, dir, rule string, k int) (remove func()) {
	t.Helper()
	_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
	p := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(p, []byte(benchPod(name, k, rule)), 0o644); err != nil {
		t.Fatal(err)
	}
	remove = func() { _ = os.Remove(p) }
	eventually(t, time.Duration(k)*40*time.Second, name+" to finish its restarts", func() error {
		starts, _ := stamps(name)
		if _, ok := starts[k+1]; !ok {
			if pod, err := kubeletPod(t, fullName(name)); err == nil && pod.Status.Phase == corev1.PodFailed {
				remove()
				t.Fatalf("%s failed", name)
			}
			return fmt.Errorf("%d starts so far", len(starts))
		}
		return nil
	})
	return remove
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

// BenchmarkRestart (make bench-restart): the first in-place restart of the
// acceptance-1 pod (init, sidecar, main; main exits 88 once), from main's
// exit to main running again, through cri-shim (native gates off) and with
// the native kubelet feature (gates on, no shim), one restart of a fresh pod
// each, alternating shim and native CRI_SHIM_BENCH_RESTARTS times (10) in
// one run; then half as many pods deleted and recreated instead. The shim
// runs with its default curve, so its figure includes the KEP-4603 initial
// delay of 1 s (docs/backoff.md), and with debug logging, so each restart's
// steps come from its trace (internal/podstate/trace.go) and the kubelet's
// PLEG events from its log (bench_restart_steps_test.go).
func BenchmarkRestart(b *testing.B) {
	if !node.up {
		b.Skip("SKIPPED: needs root and the real node stack")
	}
	n := 10
	if v, err := strconv.Atoi(os.Getenv("CRI_SHIM_BENCH_RESTARTS")); err == nil && v > 0 {
		n = v
	}
	cfg := filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const infoLevel = "level = \"info\""
	if !bytes.Contains(orig, []byte(infoLevel)) {
		b.Fatalf("%s has no %s to turn to debug", cfg, infoLevel)
	}
	if err := os.WriteFile(cfg, bytes.Replace(orig, []byte(infoLevel), []byte("level = \"debug\""), 1), 0o644); err != nil {
		b.Fatal(err)
	}
	restartShim := func() {
		killPidFile(b, "cri-shim", 15)
		if err := script("up.sh", "--start", "cri-shim"); err != nil {
			b.Fatal(err)
		}
	}
	defer restartShim()
	defer os.WriteFile(cfg, orig, 0o644)
	restartShim()
	res := map[string][]float64{}
	steps := map[string]*stepTimes{sideShim: {}, sideNative: {}}
	shimLog := &logTail{path: filepath.Join(node.env["NODE_RUN"], "cri-shim.log")}
	kubeletLog := &logTail{path: filepath.Join(node.env["NODE_RUN"], "kubelet.log")}
	for i := 0; i < n; i++ {
		for _, side := range []string{sideShim, sideNative} {
			native := side == sideNative
			switchKubelet(b, native)
			shimLog.skip()
			kubeletLog.skip()
			name, dir, rule := fmt.Sprintf("bench-shim-%d", i), node.env["MANIFESTS"], "annotation"
			if native {
				name, dir, rule = fmt.Sprintf("bench-native-%d", i), node.env["MANIFESTS_NATIVE"], "native"
			}
			remove := runInPlace(b, name, dir, rule, 1)
			// The kubelet's relist that finds main running again, and
			// the trace's tail of its reads (trace.go, traceTail); the
			// pod is deleted only after, so its deletion is not read as
			// steps of the restart.
			time.Sleep(3 * time.Second)
			gap := stampGaps(b, name, 1)[0]
			st := restartSteps(b, name, shimLog.lines(), kubeletLog.lines())
			remove()
			res[side] = append(res[side], gap)
			steps[side].add(st)
			b.Logf("%s: %.2f s; %s", name, gap, stepsLine(st))
		}
	}
	switchKubelet(b, false)
	res[sideRecreate] = recreateBlock(b, "bench-recreate", max(n/2, 1))
	writeRestartResults(b, n, res, steps)
	b.ReportMetric(median(res[sideShim]), "shim-s/restart")
	b.ReportMetric(median(res[sideNative]), "native-s/restart")
	b.ReportMetric(median(res[sideRecreate]), "recreate-s/restart")
}

const (
	sideShim     = "cri-shim (gates off)"
	sideNative   = "native kubelet (gates on)"
	sideRecreate = "recreate pod"
)

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func writeRestartResults(b *testing.B, n int, res map[string][]float64, steps map[string]*stepTimes) {
	var sb strings.Builder
	rev := codeRevision()
	fmt.Fprintf(&sb, "# In-place pod restart latency\n\n%s, %s. The first in-place restart of a fresh pod (init, sidecar, main; main exits 88 once): "+
		"main's exit to main running again (init and sidecar re-ran first), host /proc/uptime stamps (10 ms). "+
		"cri-shim and the native kubelet alternate, one restart each, %d times; then %d pods recreated through the shim.\n"+
		"cri-shim runs its default curve: each restart includes the KEP-4603 initial delay of 1 s.\n\n", time.Now().UTC().Format(time.RFC3339), rev, n, max(n/2, 1))
	fmt.Fprintf(&sb, "| side | n | median s | mean s | min s | max s |\n|---|---:|---:|---:|---:|---:|\n")
	for _, side := range []string{sideShim, sideNative, sideRecreate} {
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
	if shim := median(res[sideShim]); shim > 0 {
		fmt.Fprintf(&sb, "\nnative / cri-shim: %.2fx; recreate / cri-shim: %.2fx (medians). Restarts where cri-shim was slower than the native one run right after it: %d of %d.\n",
			median(res[sideNative])/shim, median(res[sideRecreate])/shim, slowerPairs(res[sideShim], res[sideNative]), len(res[sideShim]))
	}
	for _, side := range []string{sideShim, sideNative} {
		fmt.Fprintf(&sb, "\n## Steps, %s\n\nSeconds from main's exit (median over the restarts a step was seen in). "+
			"`trace`: cri-shim's restart trace (debug log); `kubelet`: the kubelet's log (PLEG events name the instance as name/attempt, `old` for one removed since); `pod`: the containers' own stamps.\n\n", side)
		sb.WriteString(steps[side].table())
	}
	md := sb.String()
	fmt.Print("\n" + md)
	dir := filepath.Join(node.repo, "bench", "results")
	_ = os.MkdirAll(dir, 0o755)
	_ = os.WriteFile(filepath.Join(dir, "restart-latest.md"), []byte(md), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "restart-"+time.Now().UTC().Format("20060102-150405")+"-"+rev+".md"), []byte(md), 0o644)
}

// slowerPairs counts the restarts i where cri-shim's took longer than the
// native one run right after it (shim[i] against native[i]).
func slowerPairs(shim, native []float64) int {
	k := 0
	for i := range shim {
		if i < len(native) && shim[i] > native[i] {
			k++
		}
	}
	return k
}
