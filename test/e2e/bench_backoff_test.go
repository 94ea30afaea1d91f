package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/procstat"
)

// crashPodAlways is crashPod without a rule and with restartPolicy Always: the
// kubelet's own CrashLoopBackOff governs it.
func crashPodAlways(name string) string {
	m := crashPod(name)
	m = strings.Replace(m, "  annotations:\n    restart-rules.cri-shim.io/main: '[{\"action\":\"Restart\",\"exitCodes\":{\"operator\":\"NotIn\",\"values\":[0]}}]'\n", "", 1)
	return strings.Replace(m, "restartPolicy: Never", "restartPolicy: Always", 1)
}

func pidOf(name string) int {
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], name+".pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// countStarts runs the given pods for d and returns how often each started.
func countStarts(b *testing.B, d time.Duration, pods map[string]string) map[string]int {
	for name, manifest := range pods {
		_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
		if err := os.WriteFile(filepath.Join(node.env["MANIFESTS"], name+".yaml"), []byte(manifest), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	// The window opens at each pod's first start.
	first := map[string]float64{}
	deadline := time.Now().Add(60 * time.Second)
	for len(first) < len(pods) && time.Now().Before(deadline) {
		for name := range pods {
			if s, _ := stamps(name); s[1] > 0 {
				first[name] = s[1]
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(d)
	out := map[string]int{}
	for name := range pods {
		starts, _ := stamps(name)
		for _, t := range starts {
			if t >= first[name] && t < first[name]+d.Seconds() {
				out[name]++
			}
		}
		_ = os.Remove(filepath.Join(node.env["MANIFESTS"], name+".yaml"))
	}
	return out
}

// BenchmarkBackoff (make bench-backoff): restarts of one instantly crashing
// container in 5 minutes under (a) the kubelet's default curve, (b) the
// kubelet with ReduceDefaultCrashLoopBackOffDecay, (c) cri-shim's defaults,
// (d) cri-shim with a node maximum of 1 s; then the CPU used by the shim and
// the kubelet over 60 s with 20 such pods at 1 s. (a)+(c) and (b)+(d) run side
// by side on one kubelet each.
func BenchmarkBackoff(b *testing.B) {
	if !node.up {
		b.Skip("SKIPPED: needs root and the real node stack")
	}
	window := 5 * time.Minute
	if v := os.Getenv("CRI_SHIM_BENCH_WINDOW"); v != "" {
		window, _ = time.ParseDuration(v)
	}
	res := map[string]int{}
	switchKubelet(b, false)
	for k, v := range countStarts(b, window, map[string]string{"bo-a": crashPodAlways("bo-a"), "bo-c": crashPod("bo-c")}) {
		res[k] = v
	}

	cfg := filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")
	orig, _ := os.ReadFile(cfg)
	defer func() {
		_ = os.WriteFile(cfg, orig, 0o644)
		killPidFile(b, "cri-shim", 15)
		_ = script("up.sh", "--start", "cri-shim")
	}()
	if err := os.WriteFile(cfg, append(append([]byte{}, orig...), []byte("\n[backoff]\nmax_container_restart_period = 1\n")...), 0o644); err != nil {
		b.Fatal(err)
	}
	killPidFile(b, "cri-shim", 15)
	if err := script("up.sh", "--start", "cri-shim"); err != nil {
		b.Fatal(err)
	}
	killPidFile(b, "kubelet", 15)
	_, _ = crictl(b, node.env["CONTAINERD_SOCK"], "rmp", "-fa")
	if err := script("up.sh", "--start", "kubelet-reduced"); err != nil {
		b.Fatal(err)
	}
	for k, v := range countStarts(b, window, map[string]string{"bo-b": crashPodAlways("bo-b"), "bo-d": crashPod("bo-d")}) {
		res[k] = v
	}

	// CPU with 20 crashing pods at a 1 s node maximum.
	pods := map[string]string{}
	for i := range 20 {
		n := fmt.Sprintf("bo-cpu-%02d", i)
		pods[n] = crashPod(n)
		_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", n))
		_ = os.WriteFile(filepath.Join(node.env["MANIFESTS"], n+".yaml"), []byte(pods[n]), 0o644)
	}
	time.Sleep(20 * time.Second) // all started and crashing
	refused0 := refusedTransitions()
	shimPID, kubeletPID := pidOf("cri-shim"), pidOf("kubelet")
	s0, k0 := procstat.CPUSeconds(shimPID), procstat.CPUSeconds(kubeletPID)
	t0 := time.Now()
	restarts0 := 0
	for n := range pods {
		s, _ := stamps(n)
		restarts0 += len(s)
	}
	time.Sleep(60 * time.Second)
	el := time.Since(t0).Seconds()
	shimCPU, kubeletCPU := (procstat.CPUSeconds(shimPID)-s0)/el, (procstat.CPUSeconds(kubeletPID)-k0)/el
	refused := refusedTransitions() - refused0
	restarts := -restarts0
	for n := range pods {
		s, _ := stamps(n)
		restarts += len(s)
		_ = os.Remove(filepath.Join(node.env["MANIFESTS"], n+".yaml"))
	}
	killPidFile(b, "kubelet", 15)
	_, _ = crictl(b, node.env["CONTAINERD_SOCK"], "rmp", "-fa")
	_ = script("up.sh", "--start", "kubelet")

	var sb strings.Builder
	fmt.Fprintf(&sb, "# Restart backoff\n\n%s. One container that exits 1 at once, every time; restarts counted over %s from its first start.\n\n", time.Now().UTC().Format(time.RFC3339), window)
	fmt.Fprintf(&sb, "| curve | restarts in %s |\n|---|---:|\n", window)
	fmt.Fprintf(&sb, "| (a) kubelet default (10 s doubling to 300 s), no rule, restartPolicy Always | %d |\n", res["bo-a"])
	fmt.Fprintf(&sb, "| (b) kubelet with ReduceDefaultCrashLoopBackOffDecay (1 s to 60 s) | %d |\n", res["bo-b"])
	fmt.Fprintf(&sb, "| (c) cri-shim defaults (1 s to 60 s), Restart rule, restartPolicy Never | %d |\n", res["bo-c"])
	fmt.Fprintf(&sb, "| (d) cri-shim, max_container_restart_period = 1 | %d |\n", res["bo-d"])
	fmt.Fprintf(&sb, "\n20 such pods at a 1 s node maximum, over %.0f s: %d restarts; cri-shim used %.1f%% of one core, the kubelet %.1f%%. "+
		"Status updates the kubelet refused as an illegal transition (each fails a pod): %d.\n",
		el, restarts, shimCPU*100, kubeletCPU*100, refused)
	fmt.Fprintf(&sb, "\nTargets: (c) within one restart of (b): %s; shim under 5%% of a core in (d): %s.\n",
		verdict(abs(res["bo-c"]-res["bo-b"]) <= 1), verdict(shimCPU < 0.05))
	md := sb.String()
	fmt.Print("\n" + md)
	dir := filepath.Join(node.repo, "bench", "results")
	_ = os.WriteFile(filepath.Join(dir, "backoff-latest.md"), []byte(md), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "backoff-"+time.Now().UTC().Format("20060102-150405")+".md"), []byte(md), 0o644)
	b.ReportMetric(float64(res["bo-c"]), "shim-restarts/5min")
	b.ReportMetric(shimCPU*100, "shim-%core-20pods")
}

// refusedTransitions counts the kubelet's "illegal transition" refusals so far:
// each is a pod the kubelet saw terminated and then running again.
func refusedTransitions() int {
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "kubelet.log"))
	return strings.Count(string(b), "attempted illegal transition")
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
