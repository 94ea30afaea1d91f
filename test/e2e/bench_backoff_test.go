package e2e

import (
	"fmt"
	"io"
	"net/http"
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

// countStarts runs the given pods for d and returns how often each started,
// and the share of one core the shim used over d.
func countStarts(b *testing.B, d time.Duration, pods map[string]string) (map[string]int, float64) {
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
			if v, ok := firstStart(name); ok {
				first[name] = v
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(first) < len(pods) {
		// The window opens at a start stamp; without one it would open at 0.
		b.Fatalf("only %d of %d pods stamped a first start within 60 s: %v", len(first), len(pods), first)
	}
	shim := pidOf("cri-shim")
	cpu0, t0 := procstat.CPUSeconds(shim), time.Now()
	time.Sleep(d)
	shimCPU := (procstat.CPUSeconds(shim) - cpu0) / time.Since(t0).Seconds()
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
	return out, shimCPU
}

// firstStart is a bench pod's first start stamp, if it wrote one.
func firstStart(name string) (float64, bool) {
	starts, _ := stamps(name)
	v, ok := starts[1]
	return v, ok
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
	starts, _ := countStarts(b, window, map[string]string{"bo-a": crashPodAlways("bo-a"), "bo-c": crashPod("bo-c")})
	for k, v := range starts {
		res[k] = v
	}

	defer shimAtNodeMaxOne(b)()
	starts, dCPU := countStarts(b, window, map[string]string{"bo-b": crashPodAlways("bo-b"), "bo-d": crashPod("bo-d")})
	for k, v := range starts {
		res[k] = v
	}

	c := crashingPodsCPU(b, 20, 60*time.Second)
	el, restarts, shimCPU, kubeletCPU, refused := c.elapsed, c.restarts, c.shim, c.kubelet, c.refused
	killPidFile(b, "kubelet", 15)
	clearRuntime(b)
	_ = script("up.sh", "--start", "kubelet")

	var sb strings.Builder
	fmt.Fprintf(&sb, "# Restart backoff\n\n%s. One container that exits 1 at once, every time; restarts counted over %s from its first start.\n\n", time.Now().UTC().Format(time.RFC3339), window)
	fmt.Fprintf(&sb, "| curve | restarts in %s |\n|---|---:|\n", window)
	fmt.Fprintf(&sb, "| (a) kubelet default (10 s doubling to 300 s), no rule, restartPolicy Always | %d |\n", res["bo-a"])
	fmt.Fprintf(&sb, "| (b) kubelet with ReduceDefaultCrashLoopBackOffDecay (1 s to 60 s) | %d |\n", res["bo-b"])
	fmt.Fprintf(&sb, "| (c) cri-shim defaults (1 s to 60 s), Restart rule, restartPolicy Never | %d |\n", res["bo-c"])
	fmt.Fprintf(&sb, "| (d) cri-shim, max_container_restart_period = 1 | %d |\n", res["bo-d"])
	fmt.Fprintf(&sb, "\nDuring the (b)+(d) window cri-shim used %.2f%% of one core (its governed pod (d) and the pass-through pod (b)).\n", dCPU*100)
	fmt.Fprintf(&sb, "\n20 such pods at a 1 s node maximum, over %.0f s: %d restarts (%.1f/s); cri-shim used %.1f%% of one core (%.2f ms per restart), the kubelet %.1f%%. "+
		"Status updates the kubelet refused as an illegal transition (each fails a pod): %d.\n",
		el, restarts, float64(restarts)/el, shimCPU*100, shimCPU*el*1000/float64(max(restarts, 1)), kubeletCPU*100, refused)
	fmt.Fprintf(&sb, "\nTargets: (c) within one restart of (b): %s; shim under 5%% of a core in (d): %s; and with 20 such pods: %s.\n",
		verdict(abs(res["bo-c"]-res["bo-b"]) <= 1), verdict(dCPU < 0.05), verdict(shimCPU < 0.05))
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

// cpuRun is what crashingPodsCPU measured.
type cpuRun struct {
	elapsed       float64 // seconds
	restarts      int
	shim, kubelet float64 // fraction of one core
	refused       int
}

// crashingPodsCPU runs n crashing pods under the running kubelet and shim,
// waits until they crash, then measures the CPU of both processes over d. With
// CRI_SHIM_BENCH_PROFILE=FILE (and [metrics] profiling = true in the shim's
// config) it also saves the shim's CPU profile of the window to FILE.
func crashingPodsCPU(b *testing.B, n int, d time.Duration) cpuRun {
	pods := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("bo-cpu-%02d", i)
		pods[name] = crashPod(name)
		_ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name))
		_ = os.WriteFile(filepath.Join(node.env["MANIFESTS"], name+".yaml"), []byte(pods[name]), 0o644)
	}
	// Measure only once every pod is in its crash loop (restarted at least
	// twice), so the window never includes pods still being set up.
	deadline := time.Now().Add(90 * time.Second)
	for {
		looping := 0
		for name := range pods {
			if s, _ := stamps(name); len(s) >= 3 {
				looping++
			}
		}
		if looping == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d pods crash-looping after 90 s", looping, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	refused0 := refusedTransitions()
	shimPID, kubeletPID := pidOf("cri-shim"), pidOf("kubelet")
	s0, k0 := procstat.CPUSeconds(shimPID), procstat.CPUSeconds(kubeletPID)
	t0 := time.Now()
	restarts0 := 0
	for name := range pods {
		s, _ := stamps(name)
		restarts0 += len(s)
	}
	if out := os.Getenv("CRI_SHIM_BENCH_PROFILE"); out != "" {
		go saveProfile(b, out, d-2*time.Second)
	}
	time.Sleep(d)
	var r cpuRun
	r.elapsed = time.Since(t0).Seconds()
	r.shim, r.kubelet = (procstat.CPUSeconds(shimPID)-s0)/r.elapsed, (procstat.CPUSeconds(kubeletPID)-k0)/r.elapsed
	r.refused = refusedTransitions() - refused0
	r.restarts = -restarts0
	for name := range pods {
		s, _ := stamps(name)
		r.restarts += len(s)
		_ = os.Remove(filepath.Join(node.env["MANIFESTS"], name+".yaml"))
	}
	return r
}

// saveProfile fetches the shim's CPU profile over d from its metrics address.
func saveProfile(b *testing.B, out string, d time.Duration) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", node.env["SHIM_METRICS"], int(d.Seconds()))
	resp, err := http.Get(url)
	if err != nil {
		b.Logf("profile: %v", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(out)
	if err != nil {
		b.Logf("profile: %v", err)
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}

// BenchmarkBackoffCPU runs only the 20-pod CPU part of BenchmarkBackoff (node
// maximum 1 s), printing the figures without writing bench/results; for
// profiling the shim under that load.
func BenchmarkBackoffCPU(b *testing.B) {
	if !node.up {
		b.Skip("SKIPPED: needs root and the real node stack")
	}
	defer shimAtNodeMaxOne(b)()
	defer func() {
		killPidFile(b, "kubelet", 15)
		clearRuntime(b)
		_ = script("up.sh", "--start", "kubelet")
	}()
	d := 60 * time.Second
	if v := os.Getenv("CRI_SHIM_BENCH_WINDOW"); v != "" {
		d, _ = time.ParseDuration(v)
	}
	calls0 := requestCounts(b)
	c := crashingPodsCPU(b, 20, d)
	calls := requestCounts(b)
	for m, n := range calls {
		if dn := n - calls0[m]; dn > 0 {
			fmt.Printf("  %-28s %7.0f calls, %5.2f per restart\n", m, dn, dn/float64(max(c.restarts, 1)))
		}
	}
	fmt.Printf("\n20 pods, %.0f s: %d restarts (%.1f/s); cri-shim %.1f%% of a core (%.2f ms per restart), kubelet %.1f%%; %d refusals\n",
		c.elapsed, c.restarts, float64(c.restarts)/c.elapsed, c.shim*100, c.shim*c.elapsed*1000/float64(max(c.restarts, 1)), c.kubelet*100, c.refused)
	time.Sleep(5 * time.Second)
	b.ReportMetric(c.shim*100, "shim-%core-20pods")
}

// requestCounts reads the shim's cri_shim_grpc_requests_total by method.
func requestCounts(b *testing.B) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + node.env["SHIM_METRICS"] + "/metrics")
	if err != nil {
		b.Logf("metrics: %v", err)
		return out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, "cri_shim_grpc_requests_total{")
		if !ok {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		method := ""
		for _, l := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(l, "="); ok && k == "method" {
				method = strings.Trim(v, `"`)
				method = method[strings.LastIndex(method, "/")+1:]
			}
		}
		n, _ := strconv.ParseFloat(val, 64)
		out[method] += n
	}
	return out
}

// shimAtNodeMaxOne restarts the shim with max_container_restart_period = 1
// (and /debug/pprof when CRI_SHIM_BENCH_PROFILE is set), then the kubelet with
// its own KEP-4603 curve on. The returned func puts the shim's config back and
// restarts it.
func shimAtNodeMaxOne(b *testing.B) (restore func()) {
	cfg := filepath.Join(node.env["NODE_RUN"], "cri-shim", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		b.Fatal(err)
	}
	restore = func() {
		_ = os.WriteFile(cfg, orig, 0o644)
		killPidFile(b, "cri-shim", 15)
		_ = script("up.sh", "--start", "cri-shim")
	}
	conf := string(orig)
	if os.Getenv("CRI_SHIM_BENCH_PROFILE") != "" {
		conf = strings.Replace(conf, "[metrics]\n", "[metrics]\n  profiling = true\n", 1)
	}
	if err := os.WriteFile(cfg, []byte(conf+"\n[backoff]\nmax_container_restart_period = 1\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	killPidFile(b, "cri-shim", 15)
	if err := script("up.sh", "--start", "cri-shim"); err != nil {
		restore()
		b.Fatal(err)
	}
	killPidFile(b, "kubelet", 15)
	clearRuntime(b)
	if err := script("up.sh", "--start", "kubelet-reduced"); err != nil {
		restore()
		b.Fatal(err)
	}
	return restore
}
