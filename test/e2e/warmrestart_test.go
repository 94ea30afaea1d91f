package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/ckptstore"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// warmRestartPod builds its state for 10 s (100 steps of 0.1 s), says
// "ready", then counts every 0.1 s; a file /tmp/exit makes it exit 42, which
// its Restart rule turns into an in-place restart of main. It asks for warm
// restarts; extra are more annotation lines.
func warmRestartPod(name, extra string) string {
	script := `if [ -f /tmp/ready ]; then echo state-already-built; fi; echo building; i=0; ` +
		`while [ $i -lt 100 ]; do i=$((i+1)); sleep 0.1; done; touch /tmp/ready; echo ready; ` +
		`while true; do i=$((i+1)); echo $i; if [ -f /tmp/exit ]; then rm -f /tmp/exit; echo exiting; exit 42; fi; sleep 0.1; done`
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  annotations:
    restart-rules.cri-shim.io/main: '[{"action":"Restart","exitCodes":{"operator":"In","values":[42]}}]'
    %s: "true"
%sspec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
`, name, podspec.WarmRestartKey, extra, script)
}

// logLine is one line of a CRI log file: its time and its text.
type logLine struct {
	at   time.Time
	text string
}

// readLogLines reads a CRI log file: each line's time and text.
func readLogLines(path string) []logLine {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.SplitN(sc.Text(), " ", 4)
		if len(fs) < 4 {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fs[0])
		if err != nil {
			continue
		}
		out = append(out, logLine{at, fs[3]})
	}
	return out
}

// attemptLines reads the log of a container's attempt n (n.log: the
// kubelet's restarts and the shim's replays number them 0, 1, 2...). The
// kubelet's container GC removes old instances' logs as it goes.
func attemptLines(t testing.TB, pod, c string, n int) []logLine {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", "default_"+pod+"_*", c, strconv.Itoa(n)+".log"))
	if len(m) != 1 {
		return nil
	}
	return readLogLines(m[0])
}

func findLine(ls []logLine, pred func(string) bool) (logLine, bool) {
	for _, l := range ls {
		if pred(l.text) {
			return l, true
		}
	}
	return logLine{}, false
}

func isText(s string) func(string) bool { return func(t string) bool { return t == s } }
func isNumber(t string) bool            { _, err := strconv.Atoi(t); return err == nil }
func lastNumber(ls []logLine) (n int) {
	n = -1
	for _, l := range ls {
		if v, err := strconv.Atoi(l.text); err == nil {
			n = v
		}
	}
	return n
}

// lastDelay is the backoff delay of the pod's latest restart, from the shim's log.
func lastDelay(t testing.TB, full string) time.Duration {
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
	re := regexp.MustCompile(`"msg":"podstate: restart rule matched".*"pod":"default/` + regexp.QuoteMeta(full) + `".*"delay":(\d+)`)
	var d time.Duration
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		d = time.Duration(n)
	}
	return d
}

// Issue 17, warm restart, on the real stack: a pod that needs 10 s to build
// its state and asks for warm restarts. Its first in-place restart has no
// checkpoint: it starts cold (rebuilding its state) and the shim says why.
// After 'cri-shim checkpoint', its next restart is restored from that
// checkpoint: the counter goes on from the checkpointed state, without
// rebuilding, within a second of the backoff delay.
func TestWarmRestartFromTheLatestCheckpoint(t *testing.T) {
	needKubelet(t)
	// A name of its own: a static pod's logs outlive a test that failed.
	name, cp := fmt.Sprintf("warm-rs-%d", time.Now().Unix()%100000), "e2e-warm-restart"
	full := fullName(name)
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp))
	t.Cleanup(func() { os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp)) })
	m0 := scrapeMetrics(t)
	placeManifest(t, name, warmRestartPod(name, ""))
	p := waitRunning(t, name, 90*time.Second, 0, "main")
	ready := func(attempt int) logLine {
		var l logLine
		eventually(t, 60*time.Second, fmt.Sprintf("instance %d of main saying ready", attempt), func() error {
			var ok bool
			if l, ok = findLine(attemptLines(t, full, "main", attempt), isText("ready")); !ok {
				return fmt.Errorf("not ready")
			}
			return nil
		})
		return l
	}
	first := ready(0)
	built, _ := findLine(attemptLines(t, full, "main", 0), isText("building"))
	t.Logf("first start: state built in %.1fs", first.at.Sub(built.at).Seconds())

	// No checkpoint yet: the restart is cold.
	execIn(t, p, "main", "touch /tmp/exit")
	coldReady := ready(1)
	exit0, ok := findLine(attemptLines(t, full, "main", 0), isText("exiting"))
	if !ok {
		t.Fatal("the first instance of main logged no exit")
	}
	coldDelay := lastDelay(t, full)
	if _, rebuilt := findLine(attemptLines(t, full, "main", 1), isText("building")); !rebuilt {
		t.Fatal("the cold restart did not rebuild its state")
	}
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
	if !regexp.MustCompile(`warm restart not possible.*` + regexp.QuoteMeta(full) + `.*has no checkpoint`).Match(b) {
		t.Fatal("the shim's log does not say why the restart was cold")
	}

	t.Cleanup(func() {
		if t.Failed() {
			m, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", "default_"+full+"_*", "main", "*"))
			for _, f := range m {
				b, _ := os.ReadFile(f)
				ls := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("%s: %d lines, first %q, last %q", filepath.Base(f), len(ls), ls[0], ls[len(ls)-1])
			}
			b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, full) && (strings.Contains(l, "warm") || strings.Contains(l, "checkpoint") || strings.Contains(l, "restore")) {
					t.Logf("cri-shim.log: %s", l)
				}
			}
		}
	})
	r := checkpointAndRestart(t, name, full, cp, 60*time.Second)
	warmDelay := lastDelay(t, full)
	cold := coldReady.at.Sub(exit0.at)
	warm := r.resumed.at.Sub(r.exit.at)
	t.Logf("cold restart: exit to ready %.2fs (backoff %s); warm restart: exit to counting %.2fs (backoff %s), from counter %d (checkpointed at %d, exited at %d)",
		cold.Seconds(), coldDelay, warm.Seconds(), warmDelay, r.first, r.atCheckpoint, r.atExit)
	if warm-warmDelay >= time.Second {
		t.Errorf("warm restart took %.2fs beyond its %s backoff, want under 1 s", (warm - warmDelay).Seconds(), warmDelay)
	}
	m1 := scrapeMetrics(t)
	for res, want := range map[string]float64{"cold": 1, "restored": 1} {
		k := `cri_shim_warm_restarts_total{result="` + res + `"}`
		if d := metricValue(m1, k) - max(metricValue(m0, k), 0); d != want {
			t.Errorf("%s increased by %v, want %v", k, d, want)
		}
	}
}

// Scheduled checkpoints keep a warm restart's checkpoint fresh: a pod with a
// 10 s interval (the node's minimum lowered to 10 s) gets a checkpoint every
// 10 s, only its newest two kept, and its in-place restart is restored from
// the newest.
func TestScheduledCheckpointsFeedWarmRestart(t *testing.T) {
	needKubelet(t)
	withShimConfigEdit(t, func(b []byte) []byte {
		return []byte(strings.Replace(string(b), "[checkpoint]\n", "[checkpoint]\n  min_interval = \"10s\"\n", 1))
	})
	name := fmt.Sprintf("sched-rs-%d", time.Now().Unix()%100000)
	full := fullName(name)
	placeManifest(t, name, warmRestartPod(name, fmt.Sprintf("    %s: 10s\n    %s: \"2\"\n", podspec.IntervalKey, podspec.KeepKey)))
	p := waitRunning(t, name, 90*time.Second, 0, "main")
	images := imagesSnapshot(t)
	var uid string
	eventually(t, 60*time.Second, "the pod's log directory", func() error {
		m, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", "default_"+full+"_*"))
		if len(m) != 1 {
			return fmt.Errorf("%d", len(m))
		}
		uid = strings.TrimPrefix(filepath.Base(m[0]), "default_"+full+"_")
		return nil
	})
	scheduled := func() []string {
		m, _ := filepath.Glob(filepath.Join(node.env["CHECKPOINTS"], ckptstore.ScheduledPrefix+uid+"-*"))
		var out []string
		for _, d := range m {
			if _, err := os.Stat(filepath.Join(d, "manifest.json")); err == nil {
				out = append(out, filepath.Base(d))
			}
		}
		return out
	}
	t.Cleanup(func() {
		for _, d := range scheduled() {
			os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], d))
		}
	})
	var seen []string
	var taken []time.Time    // each seen checkpoint's manifest time (when it was complete)
	var took []time.Duration // and how long its capture took
	eventually(t, 90*time.Second, "three scheduled checkpoints taken", func() error {
		for _, d := range scheduled() {
			if !slices.Contains(seen, d) {
				m, err := layout.ReadManifest(filepath.Join(node.env["CHECKPOINTS"], d))
				if err != nil {
					return err
				}
				seen, taken = append(seen, d), append(taken, m.CheckpointedAt)
				took = append(took, time.Duration(m.TotalSeconds*float64(time.Second)))
			}
		}
		if len(seen) < 3 {
			return fmt.Errorf("seen %v", seen)
		}
		return nil
	})
	// One every 10 s, to the second: the schedule wakes when the pod is due
	// (10 s after the previous one was complete), so from one complete
	// checkpoint to the next is the interval and the capture, not the
	// interval and a tick (it was 20 s in every run before).
	for i := 1; i < len(taken); i++ {
		gap := taken[i].Sub(taken[i-1])
		if start := gap - took[i]; start < 10*time.Second || start > 11*time.Second {
			t.Fatalf("scheduled checkpoint %s began %v after %s was complete, want 10 s to the second (complete %v apart, capture %v)",
				seen[i], start, seen[i-1], gap, took[i])
		}
		t.Logf("scheduled checkpoints complete %.1f s apart (capture %.1f s)", gap.Seconds(), took[i].Seconds())
	}
	// Retention removes the oldest once the newest is complete (manifest
	// written), so for that moment three are on disk.
	eventually(t, 10*time.Second, "the oldest scheduled checkpoint removed", func() error {
		if got := scheduled(); len(got) > 2 || slices.Contains(got, seen[0]) {
			return fmt.Errorf("kept %v, want the newest 2 (of %v)", got, seen)
		}
		return nil
	})
	execIn(t, p, "main", "touch /tmp/exit")
	eventually(t, 60*time.Second, "main restored from a scheduled checkpoint", func() error {
		b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
		if !regexp.MustCompile(`restored from its pod's checkpoint.*` + regexp.QuoteMeta(full) + `.*"checkpoint":"` + ckptstore.ScheduledPrefix).Match(b) {
			return fmt.Errorf("not in the shim's log yet")
		}
		return nil
	})
	waitRunning(t, name, 60*time.Second, 1, "main")
	assertNoImageChange(t, images, "the restart of "+full+" restored from a scheduled checkpoint")
	t.Logf("scheduled checkpoints seen: %v; the restart was restored from a scheduled one", seen)
}

// A container the kubelet itself restarts (restartPolicy Always, no restart
// rule: its own crash-loop backoff) in a pod asking for warm restarts: cold
// while the pod has no checkpoint, restored from the checkpoint after one.
func TestKubeletRestartIsWarm(t *testing.T) {
	needKubelet(t)
	name, cp := fmt.Sprintf("kwarm-%d", time.Now().Unix()%100000), "e2e-kubelet-warm"
	full := fullName(name)
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp))
	t.Cleanup(func() { os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp)) })
	manifest := strings.Replace(warmRestartPod(name, ""), "    restart-rules.cri-shim.io/main: '[{\"action\":\"Restart\",\"exitCodes\":{\"operator\":\"In\",\"values\":[42]}}]'\n", "", 1)
	manifest = strings.Replace(manifest, "restartPolicy: Never", "restartPolicy: Always", 1)
	if strings.Contains(manifest, "restart-rules") || !strings.Contains(manifest, "restartPolicy: Always") {
		t.Fatalf("manifest not rewritten:\n%s", manifest)
	}
	placeManifest(t, name, manifest)
	p := waitRunning(t, name, 90*time.Second, 0, "main")
	ready := func(nth int) {
		eventually(t, 90*time.Second, fmt.Sprintf("instance %d of main ready", nth), func() error {
			if _, ok := findLine(attemptLines(t, full, "main", nth), isText("ready")); !ok {
				return fmt.Errorf("not ready")
			}
			return nil
		})
	}
	ready(0)
	execIn(t, p, "main", "touch /tmp/exit")
	ready(1) // the kubelet's restart, cold: it builds its state again
	b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
	if !regexp.MustCompile(`the kubelet's restart of the container starts cold.*` + regexp.QuoteMeta(full) + `.*has no checkpoint`).Match(b) {
		t.Fatal("the shim's log does not say why the kubelet's restart was cold")
	}
	r := checkpointAndRestart(t, name, full, cp, 90*time.Second)
	t.Logf("kubelet restart after the checkpoint: counting %.2fs after the exit (the kubelet's backoff included), from %d (checkpointed at %d, exited at %d)",
		r.resumed.at.Sub(r.exit.at).Seconds(), r.first, r.atCheckpoint, r.atExit)
}

// restartFromCheckpoint is an instance restarted after a checkpoint, as the
// logs show it: the counters at the checkpoint and at the exit, the exit
// line of attempt 1 and the first count of attempt 2.
type restartFromCheckpoint struct {
	atCheckpoint, atExit, first int
	exit, resumed               logLine
}

// checkpointAndRestart checkpoints pod full into cp once attempt 1 of main
// counts past 140 (a cold start counts from 101), makes it exit, and waits up
// to wait for attempt 2 to count. containerd's restore copies the
// checkpointed log into the new instance's file first, so only lines after
// the exit are attempt 2's own. It fails the test unless attempt 2 goes on
// from the checkpointed counter without rebuilding its state, and if the
// restore added or changed an image name.
func checkpointAndRestart(t *testing.T, name, full, cp string, wait time.Duration) restartFromCheckpoint {
	t.Helper()
	images := imagesSnapshot(t)
	eventually(t, 30*time.Second, "main counting past 140", func() error {
		if n := lastNumber(attemptLines(t, full, "main", 1)); n < 140 {
			return fmt.Errorf("at %d", n)
		}
		return nil
	})
	out, err := exec.Command(node.env["SHIM_BIN"], "checkpoint", "--config", node.env["SHIM_CONFIG"],
		"--namespace", "default", "--pod", full, "--name", cp, "--timeout", "60s").CombinedOutput()
	if err != nil {
		t.Fatalf("cri-shim checkpoint: %v\n%s", err, out)
	}
	var r restartFromCheckpoint
	r.atCheckpoint = lastNumber(attemptLines(t, full, "main", 1))
	// The instance counts on past the checkpoint (two seconds of counting)
	// before it exits, so a restore from the checkpoint and a process that
	// went on from the exit log different numbers.
	eventually(t, 30*time.Second, "main counting on past the checkpoint", func() error {
		if n := lastNumber(attemptLines(t, full, "main", 1)); n < r.atCheckpoint+20 {
			return fmt.Errorf("at %d, checkpointed at %d", n, r.atCheckpoint)
		}
		return nil
	})
	p := waitRunning(t, name, 30*time.Second, 1, "main")
	execIn(t, p, "main", "touch /tmp/exit")
	eventually(t, 30*time.Second, "attempt 1 of main exiting", func() error {
		var ok bool
		if r.exit, ok = findLine(attemptLines(t, full, "main", 1), isText("exiting")); !ok {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	r.atExit = lastNumber(attemptLines(t, full, "main", 1))
	after := func() []logLine {
		var own []logLine
		for _, l := range attemptLines(t, full, "main", 2) {
			if l.at.After(r.exit.at) {
				own = append(own, l)
			}
		}
		return own
	}
	eventually(t, wait, "attempt 2 of main counting", func() error {
		var ok bool
		if r.resumed, ok = findLine(after(), isNumber); !ok {
			return fmt.Errorf("no count yet")
		}
		return nil
	})
	r.first, _ = strconv.Atoi(r.resumed.text)
	if r.first < 140 || r.first < r.atCheckpoint-5 || r.first >= r.atExit {
		t.Fatalf("the restarted process counts from %d; the checkpoint was taken at about %d and the instance exited at %d", r.first, r.atCheckpoint, r.atExit)
	}
	if _, rebuilt := findLine(after(), func(s string) bool { return s == "building" || s == "state-already-built" }); rebuilt {
		t.Fatal("the restart ran the program from its start")
	}
	assertNoImageChange(t, images, "the restart of "+full+" restored from "+cp)
	return r
}
