package e2e

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// Item 10 of issue 14: pods created and removed through the shim leave
// nothing behind, so its memory and goroutines stay flat under churn.
//
// Each pod: RunPodSandbox with a Restart rule for its container (so the
// restart machinery tracks it) and, for every fifth pod, an orchestrator
// annotation (a channel record and a connector dialling the pod); a
// container created and started; for every tenth pod the container exits 1
// and its status is read, so the rule matches and a restart is held in its
// backoff delay; then StopContainer, StopPodSandbox, RemoveContainer and
// RemovePodSandbox, as the kubelet does. The shim's RSS (/proc/PID/status),
// its goroutines and its heap after a forced GC (its /metrics, with
// profiling on) are sampled after a warm-up and after every block.

// churnSample is one measurement of the shim process.
type churnSample struct {
	pods       int
	rssKiB     int64
	goroutines int64
	heapBytes  int64 // go_memstats_heap_alloc_bytes right after a forced GC
	elapsed    time.Duration
}

func (s churnSample) String() string {
	return fmt.Sprintf("pods %6d  rss %7.1f MiB  goroutines %4d  heap after GC %7.2f MiB  elapsed %s",
		s.pods, float64(s.rssKiB)/1024, s.goroutines, float64(s.heapBytes)/(1<<20), s.elapsed.Round(time.Second))
}

// churnOpts says how pods are churned.
type churnOpts struct {
	hostNet  bool   // sandboxes on the host's network (no CNI): the orchestrator channel is refused
	logDir   string // the sandboxes' log directory
	ctrEvery int    // a container in every ctrEvery-th pod
	// exitFake, if set, ends a container's process (the fake runtime):
	// every tenth pod's container then exits 1 under its Restart rule.
	exitFake func(id string)
}

// churnPod runs pod i through its life on rt (the shim).
func churnPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, i int, o churnOpts) error {
	name := fmt.Sprintf("churn-%d", i)
	uid := fmt.Sprintf("churn-uid-%d", i)
	ann := map[string]string{"restart-rules.cri-shim.io/main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`}
	if i%5 == 0 {
		ann["pod-management.cri-shim.io/orch"] = `{"port": 50051, "version": "1.0"}`
	}
	ns := &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}
	if o.hostNet {
		ns.Network = runtimeapi.NamespaceMode_NODE
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "churn", Uid: uid},
		LogDirectory: o.logDir,
		Labels:       map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "churn", "io.kubernetes.pod.uid": uid},
		Annotations:  ann,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: ns}},
	}
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return fmt.Errorf("RunPodSandbox %s: %w", name, err)
	}
	if i%o.ctrEvery != 0 {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			return fmt.Errorf("StopPodSandbox %s: %w", name, err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			return fmt.Errorf("RemovePodSandbox %s: %w", name, err)
		}
		return nil
	}
	ctr := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
		Image:    &runtimeapi.ImageSpec{Image: busybox},
		Command:  []string{"sh", "-c", "sleep 3600"},
		LogPath:  "main/0.log",
		Labels:   map[string]string{"io.kubernetes.container.name": "main", "io.kubernetes.pod.name": name},
		Annotations: map[string]string{"io.kubernetes.container.restartCount": "0", "io.kubernetes.pod.terminationGracePeriod": "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"},
		Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: ns}},
	}
	cr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: ctr, SandboxConfig: cfg})
	if err != nil {
		return fmt.Errorf("CreateContainer %s: %w", name, err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		return fmt.Errorf("StartContainer %s: %w", name, err)
	}
	if o.exitFake != nil && i%10 == 0 {
		o.exitFake(cr.ContainerId)
		// The kubelet's look at the exit: the rule matches and the restart is held.
		if _, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: cr.ContainerId}); err != nil {
			return fmt.Errorf("ContainerStatus %s: %w", name, err)
		}
	}
	if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: cr.ContainerId, Timeout: 0}); err != nil {
		return fmt.Errorf("StopContainer %s: %w", name, err)
	}
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", name, err)
	}
	if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		return fmt.Errorf("RemoveContainer %s: %w", name, err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", name, err)
	}
	return nil
}

// churn runs pods [from, to) with workers at a time.
func churn(ctx context.Context, rt runtimeapi.RuntimeServiceClient, from, to, workers int, o churnOpts) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				err := churnPod(cctx, rt, i, o)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// sampleShim measures the shim process pid whose metrics (with profiling)
// are at addr.
func sampleShim(t testing.TB, pid int, addr string, pods int, start time.Time) churnSample {
	t.Helper()
	s := churnSample{pods: pods, elapsed: time.Since(start)}
	// A forced GC first (pprof's heap?gc=1); the heap figure is the
	// runtime's HeapAlloc read right after it, in the same answer (a later
	// /metrics read would count the profile's own garbage too).
	prof, err := httpGet("http://" + addr + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		t.Fatalf("forcing a GC in the shim (profiling on?): %v", err)
	}
	for _, l := range strings.Split(prof, "\n") {
		if v, ok := strings.CutPrefix(l, "# HeapAlloc = "); ok {
			s.heapBytes, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	s.rssKiB = procStatusKiB(t, pid, "VmRSS")
	body, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	s.goroutines = int64(metricValue(body, "go_goroutines"))
	return s
}

// heapDiff saves the shim's heap profile (after a forced GC) to path and,
// given the one saved before, returns the top of go tool pprof's
// comparison: where the live heap grew.
func heapDiff(t testing.TB, addr, base, path string) string {
	t.Helper()
	b, err := httpGet("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	if base == "" {
		return ""
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-base", base, path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go tool pprof: %v: %s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	return strings.Join(lines[:min(len(lines), 25)], "\n")
}

func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// churnBounds are the growth limits from the sample after the warm-up to
// the last one. A leak of one goroutine per pod, or of the smallest per-pod
// record the shim keeps (a podstate record with its maps and the decoded
// CreateContainer request, a channel record, a warm-start record: each well
// over 500 bytes), over the thousands of pods of a run would exceed them
// many times over; the slack is the noise of GC and of the few pods in
// flight at a sample.
type churnBounds struct {
	goroutines int64 // extra goroutines
	heapBytes  int64 // extra live heap after a forced GC
	rssKiB     int64 // extra RSS
}

// checkChurn logs the samples and fails the test on growth past b.
func checkChurn(t testing.TB, samples []churnSample, b churnBounds) string {
	t.Helper()
	var sb strings.Builder
	for _, s := range samples {
		sb.WriteString(s.String() + "\n")
	}
	warm, last := samples[0], samples[len(samples)-1]
	pods := last.pods - warm.pods
	fmt.Fprintf(&sb, "growth over %d pods after the warm-up: goroutines %+d (bound %d), heap %+.2f MiB (bound %.2f, %+.0f bytes per pod), rss %+.1f MiB (bound %.1f)\n",
		pods, last.goroutines-warm.goroutines, b.goroutines, float64(last.heapBytes-warm.heapBytes)/(1<<20), float64(b.heapBytes)/(1<<20),
		float64(last.heapBytes-warm.heapBytes)/float64(pods), float64(last.rssKiB-warm.rssKiB)/1024, float64(b.rssKiB)/1024)
	t.Log("\n" + sb.String())
	if last.goroutines-warm.goroutines > b.goroutines {
		t.Errorf("goroutines grew from %d to %d over %d pods", warm.goroutines, last.goroutines, pods)
	}
	if last.heapBytes-warm.heapBytes > b.heapBytes {
		t.Errorf("live heap grew from %d to %d bytes over %d pods", warm.heapBytes, last.heapBytes, pods)
	}
	if last.rssKiB-warm.rssKiB > b.rssKiB {
		t.Errorf("RSS grew from %d to %d KiB over %d pods", warm.rssKiB, last.rssKiB, pods)
	}
	return sb.String()
}

// saveChurn writes a run's figures to bench/results/churn-<date>.txt
// (appending, so one day's runs stay together).
func saveChurn(t testing.TB, title, body string) {
	t.Helper()
	p := filepath.Join(node.repo, "bench", "results", "churn-"+time.Now().UTC().Format("20060102")+".txt")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("saving the figures: %v", err)
		return
	}
	defer f.Close()
	rev, _ := exec.Command("git", "-C", node.repo, "describe", "--always", "--dirty").Output()
	fmt.Fprintf(f, "== %s, %s, shim %s", title, time.Now().UTC().Format(time.RFC3339), rev)
	fmt.Fprintf(f, "%s\n", body)
}

// churnPods is the number of pods of the churn against the fake runtime
// after the warm-up (CRI_SHIM_CHURN_PODS overrides it).
func churnPods(def int) int {
	if n, err := strconv.Atoi(os.Getenv("CRI_SHIM_CHURN_PODS")); err == nil && n > 0 {
		return n
	}
	return def
}

// TestChurnFakeRuntime: 5,000 pods (after 500 of warm-up) through the real
// shim binary in front of an in-memory CRI runtime (internal/fakeruntime), 8 at a time;
// the shim's per-pod state is what is measured, not containerd's.
func TestChurnFakeRuntime(t *testing.T) {
	longOnly(t, "churn at full size; the proxy's forwarding is in every other test")
	dir, err := os.MkdirTemp("/tmp", "churn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fake := fakeruntime.New()
	stop, err := fake.Serve(filepath.Join(dir, "rt.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	metrics := freeLoopbackAddr(t)
	cfg := filepath.Join(dir, "config.toml")
	body := fmt.Sprintf("state_dir = %q\n[server]\nlisten = %q\n[runtime]\nendpoint = %q\n[metrics]\naddress = %q\nprofiling = true\n"+
		"[log]\nlevel = \"warn\"\n[checkpoint]\nroot = %q\n[backoff]\ninitial_delay = \"30s\"\n",
		filepath.Join(dir, "state"), filepath.Join(dir, "shim.sock"), filepath.Join(dir, "rt.sock"), metrics, filepath.Join(dir, "checkpoints"))
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "shim.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	shim := exec.Command(filepath.Join(node.repo, "_output", "cri-shim"), "serve", "--config", cfg)
	shim.Stdout, shim.Stderr = logf, logf
	if err := shim.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = shim.Process.Signal(syscall.SIGTERM)
		_ = shim.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "shim.log"))
			t.Logf("shim log (last lines):\n%s", lastLines(string(b), 30))
		}
	}()
	eventually(t, 20*time.Second, "the shim to serve", func() error {
		_, err := httpGet("http://" + metrics + "/readyz")
		return err
	})
	rt := runtimeClient(t, filepath.Join(dir, "shim.sock"))
	ctx := ctxT(t, 30*time.Minute)
	o := churnOpts{logDir: filepath.Join(dir, "logs"), ctrEvery: 1, exitFake: func(id string) { _ = fake.Exit(id, 1) }}
	const warmup, workers, blocks = 500, 8, 5
	total := churnPods(5000)
	start := time.Now()
	if err := churn(ctx, rt, 0, warmup, workers, o); err != nil {
		t.Fatal(err)
	}
	samples := []churnSample{sampleShim(t, shim.Process.Pid, metrics, warmup, start)}
	heapBase := filepath.Join(dir, "heap-warm.pb.gz")
	heapDiff(t, metrics, "", heapBase)
	for b := 1; b <= blocks; b++ {
		from, to := warmup+(b-1)*total/blocks, warmup+b*total/blocks
		if err := churn(ctx, rt, from, to, workers, o); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, sampleShim(t, shim.Process.Pid, metrics, to, start))
	}
	// Let the connectors and held restarts of the last pods wind down.
	time.Sleep(2 * time.Second)
	samples = append(samples, sampleShim(t, shim.Process.Pid, metrics, warmup+total, start))
	if sbs, cs := fake.Counts(); sbs != 0 || cs != 0 {
		t.Errorf("%d sandboxes and %d containers left in the runtime", sbs, cs)
	}
	// Every file a pod left, at any depth (the state store's bucket
	// directories themselves stay).
	var left []string
	_ = filepath.WalkDir(filepath.Join(dir, "state"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	grew := heapDiff(t, metrics, heapBase, filepath.Join(dir, "heap-end.pb.gz"))
	summary := checkChurn(t, samples, churnBounds{goroutines: 10, heapBytes: 2 << 20, rssKiB: 16 << 10})
	summary += "live heap growth by allocation site (go tool pprof -top -base, warm-up to end):\n" + grew + "\n"
	if t.Failed() {
		if g, err := httpGet("http://" + metrics + "/debug/pprof/goroutine?debug=1"); err == nil {
			t.Logf("the shim's goroutines:\n%s", g[:min(len(g), 6000)])
		}
	}
	summary += fmt.Sprintf("state files left: %d %v\n", len(left), left[:min(len(left), 5)])
	if len(left) > 0 {
		t.Errorf("state files left after every pod was removed: %v", left[:min(len(left), 5)])
	}
	saveChurn(t, fmt.Sprintf("TestChurnFakeRuntime: %d pods after %d of warm-up, %d at a time, in-memory CRI runtime", total, warmup, workers), summary)
}

// TestChurnRealStack: 300 pods (after 60 of warm-up) through the shim on the
// real containerd, 4 at a time: host-network sandboxes (no CNI, so the
// orchestrator annotation is refused, counted and forgotten), a running
// container in every tenth. CRI_SHIM_CHURN_REAL_PODS overrides the count.
func TestChurnRealStack(t *testing.T) {
	longOnly(t, "churn at full size; the proxy's forwarding is in every other test")
	pauseKubelet(t) // its housekeeping would stop sandboxes it did not create
	withShimConfigEdit(t, func(b []byte) []byte {
		return []byte(strings.Replace(string(b), "[metrics]\n", "[metrics]\n  profiling = true\n", 1))
	})
	pid := shimPID(t)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	ctx := ctxT(t, 30*time.Minute)
	o := churnOpts{hostNet: true, logDir: t.TempDir(), ctrEvery: 10}
	const warmup, workers, blocks = 60, 4, 3
	total := 300
	if n, err := strconv.Atoi(os.Getenv("CRI_SHIM_CHURN_REAL_PODS")); err == nil && n > 0 {
		total = n
	}
	start := time.Now()
	if err := churn(ctx, rt, 0, warmup, workers, o); err != nil {
		t.Fatal(err)
	}
	addr := node.env["SHIM_METRICS"]
	samples := []churnSample{sampleShim(t, pid, addr, warmup, start)}
	for b := 1; b <= blocks; b++ {
		from, to := warmup+(b-1)*total/blocks, warmup+b*total/blocks
		if err := churn(ctx, rt, from, to, workers, o); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, sampleShim(t, pid, addr, to, start))
	}
	left, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": "churn"}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(left.Items); n != 0 {
		t.Errorf("%d churn sandboxes left in containerd", n)
	}
	// Fewer pods than the fake run: the same bounds hold with more margin
	// per pod; a per-pod leak of a goroutine (300) or a record (150 KiB at
	// 500 bytes) still shows.
	summary := checkChurn(t, samples, churnBounds{goroutines: 10, heapBytes: 1 << 20, rssKiB: 16 << 10})
	saveChurn(t, fmt.Sprintf("TestChurnRealStack: %d pods after %d of warm-up, %d at a time, containerd %s", total, warmup, workers, "v"+node.env["CONTAINERD_VERSION"]), summary)
}
