package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// freezeBreakdown is one line of where a checkpoint's freeze went, from its
// manifest (layout.FreezeTimes, layout.CaptureTimes): the pause, capture and
// resume spans, then for each container containerd's task checkpoint (of it,
// CRIU's own frozen time and its memory dump, which includes the page write:
// criu/mem.c) and the writable layer's diff, taken beside the checkpoint.
func freezeBreakdown(m *layout.Manifest) string {
	f := m.Freeze
	if f == nil {
		return fmt.Sprintf("frozen %.3f s (no breakdown in this manifest)", m.FrozenSeconds)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "frozen %.3f s = pause %.3f + capture %.3f + resume %.3f", m.FrozenSeconds, f.PauseSeconds, f.CaptureSeconds, f.ResumeSeconds)
	for _, c := range m.Containers {
		t := c.Capture
		if t == nil {
			continue
		}
		fmt.Fprintf(&b, "; %s: checkpoint %.3f (CRIU frozen %.3f: memdump %.3f, of it memwrite %.3f, %d MiB written; outside CRIU's freeze %.3f), diff %.3f",
			c.Name, t.CheckpointSeconds, t.CRIUFrozenSeconds, t.CRIUMemdumpSeconds, t.CRIUMemwriteSeconds, t.CRIUPagesWritten*4096>>20,
			t.CheckpointSeconds-t.CRIUFrozenSeconds, t.DiffSeconds)
	}
	return b.String()
}

// BenchmarkCheckpointFreeze: where a CheckpointPod's freeze goes. The
// two-container pod of BenchmarkCheckpoint (main allocates and touches each
// size of CRI_SHIM_BENCH_SIZES, the sidecar 16 MiB) is checkpointed
// CRI_SHIM_BENCH_REPS times (3 unless set) per size, and each checkpoint's
// breakdown (freezeBreakdown) printed and written to
// bench/results/checkpoint-freeze-<date>-<commit>.md.
func BenchmarkCheckpointFreeze(b *testing.B) {
	needNode(b)
	pauseKubelet(b)
	shim := runtimeClient(b, node.env["SHIM_SOCK"])
	reps := 3
	if os.Getenv("CRI_SHIM_BENCH_REPS") != "" {
		reps = benchReps(b, false)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Where a CheckpointPod's freeze goes\n\n%s, cri-shim %s, containerd %s. Command: `CRI_SHIM_BENCH_SIZES=%s go test -run '^$' -bench BenchmarkCheckpointFreeze -benchtime 1x ./test/e2e/`.\n\n",
		time.Now().UTC().Format(time.RFC3339), codeRevision(), node.env["CONTAINERD_VERSION"], os.Getenv("CRI_SHIM_BENCH_SIZES"))
	md.WriteString("Two-container pod: main allocates and touches the size shown, the sidecar 16 MiB. Seconds, from each checkpoint's manifest: the freeze is pause (every container paused through containerd) + capture (every capture ended) + resume (every container resumed); per container, containerd's task checkpoint (runc and CRIU), of it CRIU's frozen time and its memory dump (memdump, which includes the page write, memwrite: criu/mem.c), and the writable layer's diff, taken beside the checkpoint.\n\n")
	for _, mib := range benchSizes(b) {
		name := fmt.Sprintf("bench-freeze-%d", mib)
		sb, ids, logs := startPod(b, shim, name, loadCfg("main", mib, 0), loadCfg("sidecar", 16, 0))
		// A shared machine may take minutes to touch 2 GiB.
		waitReady(b, filepath.Join(logs, "main.log"), 5*time.Minute)
		waitReady(b, filepath.Join(logs, "sidecar.log"), time.Minute)
		fmt.Fprintf(&md, "main %d MiB:\n\n", mib)
		for i := range reps {
			dir := newCheckpointDir(b, fmt.Sprintf("%s-%d", name, i))
			if _, err := shim.CheckpointPod(ctxT(b, 5*time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: dir,
				ContainerIds: []string{ids["main"], ids["sidecar"]}}); err != nil {
				b.Fatal(err)
			}
			m, err := layout.ReadManifest(dir)
			if err != nil {
				b.Fatal(err)
			}
			line := freezeBreakdown(m)
			b.Logf("%d MiB, run %d: %s", mib, i+1, line)
			fmt.Fprintf(&md, "- %s\n", line)
			os.RemoveAll(dir)
		}
		md.WriteString("\n")
		removePod(shim, sb)
	}
	out := md.String()
	fmt.Print("\n" + out)
	_ = os.WriteFile(filepath.Join(node.repo, "bench", "results", "checkpoint-freeze-"+time.Now().UTC().Format("20060102-150405")+"-"+codeRevision()+".md"), []byte(out), 0o644)
}
