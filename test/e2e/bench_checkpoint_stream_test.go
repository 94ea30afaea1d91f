package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// streamRounds is how many checkpoints of each pod each mode takes
// (CRI_SHIM_BENCH_STREAM_ROUNDS, default 5).
func streamRounds() int {
	if n, err := strconv.Atoi(os.Getenv("CRI_SHIM_BENCH_STREAM_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 5
}

// BenchmarkCheckpointStream (part of make bench-checkpoint): the same pods
// checkpointed by the same shim binary with its archives streamed during the
// capture ([checkpoint] stream_archives = true, the default) and written after
// the resume (false), the modes alternating round after round (the shim
// restarted with the other setting in between): the frozen window and the
// whole call of each, medians, with their ratios.
func BenchmarkCheckpointStream(b *testing.B) {
	needNode(b)
	pauseKubelet(b)
	direct := runtimeClient(b, node.env["CONTAINERD_SOCK"])
	root := node.env["CHECKPOINTS"]
	os.MkdirAll(root, 0o700)
	disk := ddBandwidth(b, root)

	sizes := []int{64, 512, 2048}
	type pod struct {
		sb  string
		ids []string
	}
	pods := map[int]pod{}
	for _, mib := range sizes {
		// Made on containerd: the pods outlive the shim's restarts.
		sb, ids, logs := startPod(b, direct, fmt.Sprintf("bench-stream-%d", mib), loadCfg("main", mib, 0), loadCfg("sidecar", 16, 0))
		waitReady(b, filepath.Join(logs, "main.log"), time.Minute)
		waitReady(b, filepath.Join(logs, "sidecar.log"), time.Minute)
		pods[mib] = pod{sb: sb, ids: []string{ids["main"], ids["sidecar"]}}
	}
	type sample struct{ frozen, capture, total []float64 }
	got := map[bool]map[int]*sample{true: {}, false: {}}
	for _, mib := range sizes {
		got[true][mib], got[false][mib] = &sample{}, &sample{}
	}
	var size = map[int]int64{}
	restart, orig := shimConfigSwitch(b)
	rounds := streamRounds()
	for round := 0; round < rounds; round++ {
		for _, stream := range []bool{true, false} {
			cfg := strings.Replace(string(orig), "[checkpoint]\n", fmt.Sprintf("[checkpoint]\nstream_archives = %v\n", stream), 1)
			if cfg == string(orig) {
				b.Fatal("the shim's config has no [checkpoint] section to set stream_archives in")
			}
			restart([]byte(cfg))
			// The mode took: the shim says so at start.
			want := map[bool]string{true: "during the capture", false: "after the resume"}[stream]
			if line := lastLogLine(b, "checkpoint: memory pages copied"); !strings.Contains(line, want) {
				b.Fatalf("stream_archives=%v, but the shim logged %q", stream, line)
			}
			shim := runtimeClient(b, node.env["SHIM_SOCK"])
			for _, mib := range sizes {
				p := pods[mib]
				dir := newCheckpointDir(b, fmt.Sprintf("bench-stream-%d-%v-%d", mib, stream, round))
				t0 := time.Now()
				if _, err := shim.CheckpointPod(ctxT(b, 5*time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: p.sb, OutputPath: dir, ContainerIds: p.ids}); err != nil {
					b.Fatalf("stream_archives=%v, %d MiB: %v", stream, mib, err)
				}
				total := time.Since(t0)
				m, err := layout.ReadManifest(dir)
				if err != nil {
					b.Fatal(err)
				}
				size[mib] = m.SizeBytes
				s := got[stream][mib]
				s.frozen = append(s.frozen, m.FrozenSeconds)
				slowest := 0.0
				for _, c := range m.Containers {
					slowest = max(slowest, c.DumpSeconds)
				}
				s.capture = append(s.capture, slowest)
				s.total = append(s.total, total.Seconds())
				os.RemoveAll(dir)
			}
		}
	}

	var md strings.Builder
	fmt.Fprintf(&md, "# Checkpoint archives streamed during the capture, against written after the resume\n\n%s, code %s. The same shim binary, `[checkpoint] stream_archives` true and false, alternating %d rounds (the shim restarted with the other setting in between); the same running pods each time: main allocates and touches the size shown, the sidecar 16 MiB. Medians (all samples in brackets). Disk: sequential write %.0f MB/s (dd, 1 GiB, fdatasync, in the checkpoint root).\n\n",
		time.Now().UTC().Format(time.RFC3339), codeRevision(), rounds, disk/1e6)
	md.WriteString("| main | checkpoint | pod paused, streamed | pod paused, after resume | ratio | slowest capture (CRIU, diff), streamed / after resume | whole call, streamed | whole call, after resume | ratio | whole-call throughput, streamed / after resume |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, mib := range sizes {
		on, off := got[true][mib], got[false][mib]
		fOn, fOff, tOn, tOff := median(on.frozen), median(off.frozen), median(on.total), median(off.total)
		fmt.Fprintf(&md, "| %d MiB | %.0f MiB | %.2f s %s | %.2f s %s | %.2f | %.2f s / %.2f s | %.2f s %s | %.2f s %s | %.2f | %.0f%% / %.0f%% of disk |\n",
			mib, float64(size[mib])/(1<<20), fOn, samples(on.frozen), fOff, samples(off.frozen), fOn/fOff, median(on.capture), median(off.capture), tOn, samples(on.total), tOff, samples(off.total), tOn/tOff,
			100*float64(size[mib])/tOn/disk, 100*float64(size[mib])/tOff/disk)
	}
	out := md.String()
	fmt.Print("\n" + out)
	rdir := filepath.Join(node.repo, "bench", "results")
	_ = os.WriteFile(filepath.Join(rdir, "checkpoint-stream-"+time.Now().UTC().Format("20060102-150405")+".md"), []byte(out), 0o644)
}

// lastLogLine is the cri-shim log's last line containing s ("" if none).
func lastLogLine(t testing.TB, s string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
	if err != nil {
		t.Fatal(err)
	}
	last := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			last = l
		}
	}
	return last
}

// samples lists v with two decimals, in brackets.
func samples(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
