package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// loadCfg is the benchmark's workload in a busybox container: the shell
// holds mib MiB in a variable (allocated and written) and then waits; a
// second, small shell, started first, waits for it, spends warmup "getting
// ready" (a model loading, a JIT warming up), prints "ready", then an
// increasing counter every 100 ms, the first at once (as before, a checkpoint
// taken when "ready" is seen holds the counter about to print 0). A restored process goes on counting; a fresh one would
// start over after its warm-up. The shell holding the memory forks nothing
// once ready: a fork of it (a "sleep") caught by a checkpoint between fork
// and exec would double what is dumped.
func loadCfg(name string, mib int, warmup time.Duration) *runtimeapi.ContainerConfig {
	c := counterCfg(name)
	sleep := ""
	if warmup > 0 {
		sleep = fmt.Sprintf("sleep %d; ", int(warmup.Seconds()))
	}
	c.Command = []string{"sh", "-c", fmt.Sprintf("(until [ -e /tmp/held ]; do sleep 0.1; done; %secho ready; i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done) & "+
		"x=$(head -c %d /dev/zero | tr '\\0' a); : > /tmp/held; wait", sleep, mib<<20)}
	return c
}

// waitLine waits until a container's log has a line matching pred, written after since.
func waitLine(t testing.TB, path string, since time.Time, timeout time.Duration, what string) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, timeout, what, func() error {
		b, _ := os.ReadFile(path)
		for _, l := range strings.Split(string(b), "\n") {
			fs := strings.Fields(l)
			if len(fs) < 4 {
				continue
			}
			ts, err := time.Parse(time.RFC3339Nano, fs[0])
			if err == nil && ts.After(since) {
				at = ts
				return nil
			}
		}
		return fmt.Errorf("no line in %s after %s", filepath.Base(path), since.Format(time.StampMilli))
	})
	return at
}

func waitReady(t testing.TB, path string, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, timeout, "ready in "+filepath.Base(path), func() error {
		b, _ := os.ReadFile(path)
		for _, l := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(l); len(fs) >= 4 && fs[len(fs)-1] == "ready" {
				at, _ = time.Parse(time.RFC3339Nano, fs[0])
				return nil
			}
		}
		return fmt.Errorf("not ready")
	})
	return at
}

// ddBandwidth measures sequential write bandwidth (bytes/s) in dir with dd,
// 1 GiB flushed to disk.
func ddBandwidth(t testing.TB, dir string) float64 {
	t.Helper()
	f := filepath.Join(dir, ".dd-bench")
	defer os.Remove(f)
	out, err := exec.Command("dd", "if=/dev/zero", "of="+f, "bs=1M", "count=1024", "conv=fdatasync").CombinedOutput()
	if err != nil {
		t.Fatalf("dd: %v %s", err, out)
	}
	m := regexp.MustCompile(`(\d+) bytes .* copied, ([0-9.]+) s`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("dd output: %s", out)
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	s, _ := strconv.ParseFloat(m[2], 64)
	return n / s
}

type ckptResult struct {
	mib                        int
	size                       int64
	shimCP, baseCP             time.Duration
	shimFrozen                 time.Duration
	freeze                     string          // where the freeze went (freezeBreakdown)
	shimRestores, baseRestores []time.Duration // restore to running, each run
	shimCreates, baseCreates   []time.Duration // of which the restore calls before the starts
	failures                   []string
	oci                        ociResult
}

// BenchmarkCheckpoint (make bench-checkpoint): a two-container pod (main
// allocates and touches 64 MiB, 512 MiB, then 2 GiB; a sidecar 16 MiB) checkpointed
// and restored to running through cri-shim (CheckpointPod, RestorePod +
// StartContainer), against containerd's own CheckpointContainer and restore,
// container by container; then the cold start of a workload that needs 10 s
// to become ready against its warm start from a checkpoint; each checkpoint
// pushed to and pulled from the stack's registry against the registry's raw
// blob throughput; and the disk's sequential write bandwidth, measured in the
// same run.
func BenchmarkCheckpoint(b *testing.B) {
	needNode(b)
	pauseKubelet(b)
	shim := runtimeClient(b, node.env["SHIM_SOCK"])
	direct := runtimeClient(b, node.env["CONTAINERD_SOCK"])
	root := node.env["CHECKPOINTS"]
	os.MkdirAll(root, 0o700)
	disk := ddBandwidth(b, root)

	var results []ckptResult
	for _, mib := range benchSizes(b) {
		r := ckptResult{mib: mib}
		name := fmt.Sprintf("bench-cp-%d", mib)
		sb, ids, logs := startPod(b, shim, name, loadCfg("main", mib, 0), loadCfg("sidecar", 16, 0))
		waitReady(b, filepath.Join(logs, "main.log"), time.Minute)
		waitReady(b, filepath.Join(logs, "sidecar.log"), time.Minute)
		cfgs := []*runtimeapi.ContainerConfig{loadCfg("main", mib, 0), loadCfg("sidecar", 16, 0)}

		// Through cri-shim: one pod-wide cut.
		dir := newCheckpointDir(b, name)
		t0 := time.Now()
		if _, err := shim.CheckpointPod(ctxT(b, 5*time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: dir,
			ContainerIds: []string{ids["main"], ids["sidecar"]}}); err != nil {
			b.Fatal(err)
		}
		r.shimCP = time.Since(t0)
		m, err := layout.ReadManifest(dir)
		if err != nil {
			b.Fatal(err)
		}
		r.size = m.SizeBytes
		r.shimFrozen = time.Duration(m.FrozenSeconds * float64(time.Second))
		r.freeze = freezeBreakdown(m)
		// Baseline: containerd's CheckpointContainer, one container after the other.
		base := newCheckpointDir(b, name+"-base")
		t0 = time.Now()
		for _, c := range []string{"main", "sidecar"} {
			if _, err := direct.CheckpointContainer(ctxT(b, 5*time.Minute), &runtimeapi.CheckpointContainerRequest{ContainerId: ids[c],
				Location: filepath.Join(base, c+".tar")}); err != nil {
				b.Fatal(err)
			}
		}
		r.baseCP = time.Since(t0)
		// Restore to running: cri-shim's route and, when the run switched it on
		// (CRI_SHIM_BENCH_IMPORT_BASELINE=1 with containerd's
		// enable_experimental_restore_via_create, make bench-checkpoint-baseline),
		// containerd's own restore (the archive as the image; off by default in
		// 2.2.9 and 2.3, removed in 2.4), in ABBA order so that page
		// cache and disk state favour neither; the median is reported.
		shimRestore := func() (time.Duration, time.Duration, []string) {
			return restoreAndStartTimed(b, shim, fmt.Sprintf("%s-r%d", name, len(r.shimRestores)), func(cfg *runtimeapi.PodSandboxConfig) (string, map[string]string) {
				rr, err := shim.RestorePod(ctxT(b, 5*time.Minute), &runtimeapi.RestorePodRequest{CheckpointPath: dir, Config: cfg, ContainerConfigs: cfgs})
				if err != nil {
					b.Fatal(err)
				}
				out := map[string]string{}
				for _, c := range rr.RestoredContainers {
					out[c.Name] = c.ContainerId
				}
				return rr.PodSandboxId, out
			})
		}
		baseRestore := func() (time.Duration, time.Duration, []string) {
			return restoreAndStartTimed(b, direct, fmt.Sprintf("%s-b%d", name, len(r.baseRestores)), func(cfg *runtimeapi.PodSandboxConfig) (string, map[string]string) {
				s, err := direct.RunPodSandbox(ctxT(b, time.Minute), &runtimeapi.RunPodSandboxRequest{Config: cfg})
				if err != nil {
					b.Fatal(err)
				}
				out := map[string]string{}
				for _, c := range cfgs {
					cc := loadCfg(c.Metadata.Name, 16, 0)
					cc.Image = &runtimeapi.ImageSpec{Image: filepath.Join(base, c.Metadata.Name+".tar")}
					cr, err := direct.CreateContainer(ctxT(b, 5*time.Minute), &runtimeapi.CreateContainerRequest{PodSandboxId: s.PodSandboxId, Config: cc, SandboxConfig: cfg})
					if err != nil {
						b.Fatal(err)
					}
					out[c.Metadata.Name] = cr.ContainerId
				}
				return s.PodSandboxId, out
			})
		}
		withBase := os.Getenv("CRI_SHIM_BENCH_IMPORT_BASELINE") == "1"
		runShim := func() {
			d, c, fails := shimRestore()
			r.shimRestores = append(r.shimRestores, d)
			r.shimCreates = append(r.shimCreates, c)
			r.failures = append(r.failures, fails...)
		}
		runBase := func() {
			d, c, fails := baseRestore()
			r.baseRestores = append(r.baseRestores, d)
			r.baseCreates = append(r.baseCreates, c)
			r.failures = append(r.failures, fails...)
		}
		// With the baseline, the order alternates ABBA (shim, base, base,
		// shim, ...) so that neither route always follows the other's pod
		// removal, nor always runs first after the checkpoint.
		for i := 0; i < benchReps(b, withBase); i++ {
			switch {
			case !withBase:
				runShim()
			case i%2 == 0:
				runShim()
				runBase()
			default:
				runBase()
				runShim()
			}
		}
		// Last: its gigabytes written and read must not slow the restores above.
		r.oci = registryFigures(b, dir, m.SizeBytes, fmt.Sprintf("%d-%d", mib, time.Now().Unix()))
		removePod(shim, sb)
		os.RemoveAll(dir)
		os.RemoveAll(base)
		results = append(results, r)
	}

	// The warm-start story: a workload that needs 10 s to become ready.
	t0 := time.Now()
	sb, ids, logs := startPod(b, shim, "bench-cold", loadCfg("main", 64, 10*time.Second))
	cold := waitReady(b, filepath.Join(logs, "main.log"), time.Minute).Sub(t0)
	dir := newCheckpointDir(b, "bench-warm")
	if _, err := shim.CheckpointPod(ctxT(b, 5*time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: dir,
		ContainerIds: []string{ids["main"]}}); err != nil {
		b.Fatal(err)
	}
	removePod(shim, sb)
	var warm time.Duration = -1
	var warmFails []string
	for attempt := 0; attempt < 3 && warm < 0; attempt++ {
		warmLogs := filepath.Join(b.TempDir(), "logs")
		os.MkdirAll(warmLogs, 0o755)
		t0 = time.Now()
		rr, err := shim.RestorePod(ctxT(b, 5*time.Minute), &runtimeapi.RestorePodRequest{CheckpointPath: dir,
			Config:           sandboxCfg(fmt.Sprintf("bench-warm-%d", attempt), fmt.Sprintf("bench-warm-%d-uid", attempt), warmLogs),
			ContainerConfigs: []*runtimeapi.ContainerConfig{loadCfg("main", 64, 10*time.Second)}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := shim.StartContainer(ctxT(b, 5*time.Minute), &runtimeapi.StartContainerRequest{ContainerId: rr.RestoredContainers[0].ContainerId}); err != nil {
			warmFails = append(warmFails, status.Convert(err).Message())
			removePod(shim, rr.PodSandboxId)
			continue
		}
		warm = waitLine(b, filepath.Join(warmLogs, "main.log"), t0, time.Minute, "warm-started workload answering").Sub(t0)
		removePod(shim, rr.PodSandboxId)
	}
	os.RemoveAll(dir)

	var md strings.Builder
	fmt.Fprintf(&md, "# Pod checkpoint/restore\n\n%s, cri-shim %s. CRIU 4 via runc and containerd %s, kubelet %s; disk: sequential write %.0f MB/s (dd, 1 GiB, fdatasync, in the checkpoint root).\n\n",
		time.Now().UTC().Format(time.RFC3339), codeRevision(), node.env["CONTAINERD_VERSION"], node.env["KUBELET_VERSION"], disk/1e6)
	md.WriteString("Two-container pod: main allocates and touches the size shown, the sidecar 16 MiB. Checkpoint: cri-shim's CheckpointPod (both paused, captured in parallel, resumed) against containerd's CheckpointContainer of each container in sequence. Restore to running: RestorePod + StartContainer of each (cri-shim's restore route: the pod's own config, the images restored by its runtime shim), against RunPodSandbox + CreateContainer(archive) + StartContainer of each on containerd (containerd's own restore, the route cri-shim used before; 2.2 only).\n\n")
	md.WriteString("Dump throughput: checkpoint size over the whole CheckpointPod call (archives written and fsynced); in brackets, over the CRIU capture phase alone (the pod paused).\n\n")
	md.WriteString("Restore to running: the median, each run in brackets; `create` is the median part before the first StartContainer (RestorePod; RunPodSandbox + CreateContainer for containerd's).\n\n")
	md.WriteString("| main | checkpoint size | cri-shim checkpoint | (pod paused) | containerd, per container in sequence | ratio | dump throughput | cri-shim restore to running | containerd restore to running | failed starts |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	okCP, okTP, okRestore, haveBase := true, true, true, false
	var failures []string
	for _, r := range results {
		tp := float64(r.size) / r.shimCP.Seconds()
		okCP = okCP && r.shimCP <= r.baseCP
		if len(r.baseRestores) > 0 {
			haveBase = true
			okRestore = okRestore && medianDuration(r.shimRestores) <= medianDuration(r.baseRestores)
		}
		okTP = okTP && tp >= disk/2
		ctp := float64(r.size) / r.shimFrozen.Seconds()
		fmt.Fprintf(&md, "| %d MiB | %.0f MiB | %.2f s | %.2f s | %.2f s | %.2f | %.0f MB/s, %.0f%% of disk (capture: %.0f MB/s, %.0f%%) | %s | %s | %d |\n", r.mib, float64(r.size)/(1<<20),
			r.shimCP.Seconds(), r.shimFrozen.Seconds(), r.baseCP.Seconds(), r.shimCP.Seconds()/r.baseCP.Seconds(), tp/1e6, 100*tp/disk, ctp/1e6, 100*ctp/disk,
			medianRuns(r.shimRestores)+createPart(r.shimCreates), medianRuns(r.baseRestores)+createPart(r.baseCreates), len(r.failures))
		failures = append(failures, r.failures...)
	}
	md.WriteString("\nWhere the freeze went (seconds; BenchmarkCheckpointFreeze repeats it):\n\n")
	for _, r := range results {
		fmt.Fprintf(&md, "- %d MiB: %s\n", r.mib, r.freeze)
	}
	md.WriteString("\nThrough the stack's registry (distribution, loopback, plain HTTP): `cri-shim checkpoint push` of the checkpoint and `pull` of it into a new directory (the CLI, process start included), against one blob of the same size of random bytes written and read straight through go-containerregistry in the same run.\n\n")
	md.WriteString("| main | checkpoint size | push | raw blob write | push / raw | pull | raw blob read | pull / raw |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		o := r.oci
		fmt.Fprintf(&md, "| %d MiB | %.0f MiB | %.2f s, %s | %.2f s, %s | %.2f | %.2f s, %s | %.2f s, %s | %.2f |\n", r.mib, float64(o.bytes)/(1<<20),
			o.push.Seconds(), mbps(o.bytes, o.push), o.rawPush.Seconds(), mbps(o.bytes, o.rawPush), o.rawPush.Seconds()/o.push.Seconds(),
			o.pull.Seconds(), mbps(o.bytes, o.pull), o.rawPull.Seconds(), mbps(o.bytes, o.rawPull), o.rawPull.Seconds()/o.pull.Seconds())
	}
	fmt.Fprintf(&md, "\nWarm start: a workload that needs 10 s to become ready (64 MiB) took %.2f s from RunPodSandbox to ready cold; restored from its checkpoint it answered %s after RestorePod was called (%d failed starts before).\n", cold.Seconds(), secs(warm), len(warmFails))
	failures = append(failures, warmFails...)
	if len(failures) > 0 {
		fmt.Fprintf(&md, "\nStartContainer of a restored container failed %d times (each restore was retried, up to 3 times); first error: `%s`. See docs/checkpoint.md, open problems.\n", len(failures), failures[0])
	}
	fmt.Fprintf(&md, "\nTargets: pod checkpoint no slower than the per-container baseline: %s; dump throughput (whole call) at least half the disk bandwidth: %s; warm start under 1 s: %s.\n",
		verdict(okCP), verdict(okTP), verdict(warm >= 0 && warm < time.Second))
	if haveBase {
		fmt.Fprintf(&md, "Restore to running (median of %d) no slower than containerd's own restore at every size: %s.\n", len(results[0].shimRestores), verdict(okRestore))
	}
	out := md.String()
	fmt.Print("\n" + out)
	rdir := filepath.Join(node.repo, "bench", "results")
	_ = os.WriteFile(filepath.Join(rdir, "checkpoint-latest.md"), []byte(out), 0o644)
	_ = os.WriteFile(filepath.Join(rdir, "checkpoint-"+time.Now().UTC().Format("20060102-150405")+"-containerd-"+node.env["CONTAINERD_VERSION"]+".md"), []byte(out), 0o644)
	b.ReportMetric(results[0].shimCP.Seconds()/results[0].baseCP.Seconds(), "cp-ratio-64MiB")
	b.ReportMetric(warm.Seconds(), "warm-start-s")
}

// restoreAndStart restores a pod with create (which returns the sandbox and
// its containers by name), starts each container and returns the time from
// the call to every container running with its counter going on. A start that
// fails is counted (and reported) and the restore tried again, up to 3 times;
// -1 when all failed. (Before the containers had a PID namespace each, CRIU
// failed here with "type NOTIFY errno 17": PID collisions, docs/checkpoint.md.)
func restoreAndStart(t testing.TB, rt runtimeapi.RuntimeServiceClient, name string, create func(*runtimeapi.PodSandboxConfig) (string, map[string]string)) (time.Duration, []string) {
	t.Helper()
	d, _, failures := restoreAndStartTimed(t, rt, name, create)
	return d, failures
}

// restoreAndStartTimed is restoreAndStart that also returns the part of the
// time spent in create (the restore calls before the starts).
func restoreAndStartTimed(t testing.TB, rt runtimeapi.RuntimeServiceClient, name string, create func(*runtimeapi.PodSandboxConfig) (string, map[string]string)) (time.Duration, time.Duration, []string) {
	t.Helper()
	var failures []string
	for attempt := 0; attempt < 3; attempt++ {
		logs := filepath.Join(t.TempDir(), "logs")
		os.MkdirAll(logs, 0o755)
		t0 := time.Now()
		sb, ids := create(sandboxCfg(fmt.Sprintf("%s-%d", name, attempt), fmt.Sprintf("%s-%d-uid", name, attempt), logs))
		created := time.Since(t0)
		var err error
		for _, id := range ids {
			if _, err = rt.StartContainer(ctxT(t, 5*time.Minute), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
				break
			}
		}
		if err != nil {
			failures = append(failures, status.Convert(err).Message())
			removePod(rt, sb)
			continue
		}
		d := time.Since(t0)
		for n := range ids {
			waitLine(t, filepath.Join(logs, n+".log"), t0, 30*time.Second, n+" restored and counting")
			if _, first := countersSince(t, filepath.Join(logs, n+".log"), t0); first < 1 {
				t.Fatalf("%s: restored process logged %d first: not a restore", n, first)
			}
		}
		removePod(rt, sb)
		return d, created, failures
	}
	return -1, -1, failures
}

// createPart is the median create part of runs, "" for none.
func createPart(runs []time.Duration) string {
	if len(runs) == 0 {
		return ""
	}
	return "; create " + secs(medianDuration(runs))
}

// benchSizes are the main container's sizes in MiB: 64, 512 and 2048, or
// CRI_SHIM_BENCH_SIZES (comma-separated) to repeat one.
func benchSizes(t testing.TB) []int {
	v := os.Getenv("CRI_SHIM_BENCH_SIZES")
	if v == "" {
		return []int{64, 512, 2048}
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 16 {
			t.Fatalf("CRI_SHIM_BENCH_SIZES: %q is not a size in MiB (at least 16)", f)
		}
		out = append(out, n)
	}
	return out
}

// benchReps is how many times each restore runs: 3 with the baseline (the
// median of 3, in ABBA order), 1 without, or CRI_SHIM_BENCH_REPS.
func benchReps(t testing.TB, withBase bool) int {
	if v := os.Getenv("CRI_SHIM_BENCH_REPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			t.Fatalf("CRI_SHIM_BENCH_REPS: %q is not a count from 1 to 50", v)
		}
		return n
	}
	if withBase {
		return 3
	}
	return 1
}

// medianDuration of runs (a failed run, -1, sorts first).
func medianDuration(runs []time.Duration) time.Duration {
	return time.Duration(median(durationsF(runs)))
}

func durationsF(runs []time.Duration) []float64 {
	out := make([]float64, len(runs))
	for i, d := range runs {
		out[i] = float64(d)
	}
	return out
}

// medianRuns is the median of runs with every run in brackets when more than one.
func medianRuns(runs []time.Duration) string {
	if len(runs) == 0 {
		return "n/a (off in this containerd; make bench-checkpoint-baseline)"
	}
	out := secs(medianDuration(runs))
	if len(runs) > 1 {
		var each []string
		for _, d := range runs {
			each = append(each, secs(d))
		}
		out += " (" + strings.Join(each, ", ") + ")"
	}
	return out
}

func secs(d time.Duration) string {
	if d == -2 {
		return "n/a (not in this containerd)"
	}
	if d < 0 {
		return "failed"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
