package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/podstatus"
)

// demoNS is the namespace of the demo's API pods (deploy/examples/demo/api).
const demoNS = "cri-shim-demo"

// demoCommands runs test/stack/demo.sh (what `make run` ends with) on the
// running node, the shim acting as the node in the API, and returns the
// commands it printed, one per feature and four for the API side, in order.
func demoCommands(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(node.repo, "test", "stack", "demo.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo.sh: %v\n%s", err, out)
	}
	t.Logf("demo.sh printed:\n%s", out)
	var cmds []string
	for _, l := range strings.Split(string(out), "\n") {
		if c, ok := strings.CutPrefix(l, "   $ "); ok {
			cmds = append(cmds, c)
		}
	}
	if len(cmds) != 8 {
		t.Fatalf("demo.sh printed %d commands, want one for each of the 4 features and 4 of the API side", len(cmds))
	}
	return cmds
}

// sh runs one printed command as a user pasting it would.
func sh(t *testing.T, c string) string {
	t.Helper()
	out, err := exec.Command("bash", "-c", c).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n(exit: %v)", out, err)
	}
	return string(out)
}

// table parses column output (crictl, cri-shim pods): columns are separated
// by two or more spaces; one map per row, keyed by the header.
func table(out string) []map[string]string {
	cols := regexp.MustCompile(`\s{2,}`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 {
		return nil
	}
	head := cols.Split(strings.TrimSpace(lines[0]), -1)
	var rows []map[string]string
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			break // cri-shim pods: the channel table follows
		}
		f := cols.Split(strings.TrimSpace(l), -1)
		r := map[string]string{}
		for i := range min(len(f), len(head)) {
			r[head[i]] = f[i]
		}
		rows = append(rows, r)
	}
	return rows
}

// inPlaceRestarted: the crictl listing of demo-restart shows every instance in
// one sandbox, and init and main started again (attempt 1 or more).
func inPlaceRestarted(out string) error {
	rows := table(out)
	pods := map[string]bool{}
	again := map[string]bool{}
	for _, r := range rows {
		pods[r["POD ID"]] = true
		if n, err := strconv.Atoi(r["ATTEMPT"]); err == nil && n >= 1 {
			again[r["NAME"]] = true
		}
	}
	if len(rows) == 0 || len(pods) != 1 {
		return fmt.Errorf("want the containers of one sandbox, got %d sandboxes:\n%s", len(pods), out)
	}
	if !again["init"] || !again["main"] || !again["sidecar"] {
		return fmt.Errorf("init, sidecar and main not all started again in place yet:\n%s", out)
	}
	return nil
}

// crashLoopOnCurve: cri-shim pods shows demo-crashloop's container restarted
// by its Restart rule, with a delay within the demo node's 5 s cap (the
// kubelet's own CrashLoopBackOff starts at 10 s).
func crashLoopOnCurve(out string) error {
	for _, r := range table(out) {
		if !strings.HasPrefix(r["POD"], "default/demo-crashloop-") {
			continue
		}
		n := 0
		fmt.Sscanf(r["CONTAINER RESTARTS"], "crash=%d", &n)
		d, err := time.ParseDuration(r["DELAY"])
		switch {
		case n < 3:
			return fmt.Errorf("crash restarted %d times, want 3 or more:\n%s", n, out)
		case r["LAST TRIGGER"] != "crash exit 1 (Restart)":
			return fmt.Errorf("last trigger %q:\n%s", r["LAST TRIGGER"], out)
		case err != nil || d < time.Second || d > 5*time.Second:
			return fmt.Errorf("delay %q, want 1s to 5s:\n%s", r["DELAY"], out)
		}
		return nil
	}
	return fmt.Errorf("no demo-crashloop row:\n%s", out)
}

var countLine = regexp.MustCompile(`count (\d+) in (\S+), counting since (\S+)`)

// warmStarted: the last line demo-warm's main printed in demo-counter (its log
// was restored with it) and the first it printed in demo-warm: the next count
// (or the one after, if the log had not caught up when the checkpoint was
// cut), the same start time: one process that went on where it was checkpointed.
func warmStarted(srcPod, dstPod string) func(string) error {
	return func(out string) error {
		var lines [][]string
		for _, l := range strings.Split(out, "\n") {
			if m := countLine.FindStringSubmatch(l); m != nil {
				lines = append(lines, m)
			}
		}
		if len(lines) != 2 {
			return fmt.Errorf("want the last line in %s and the first in %s:\n%s", srcPod, dstPod, out)
		}
		src, dst := lines[0], lines[1]
		n, _ := strconv.Atoi(src[1])
		m, _ := strconv.Atoi(dst[1])
		if !strings.HasPrefix(src[2], srcPod) || !strings.HasPrefix(dst[2], dstPod) || n < 3 || m <= n || m > n+2 || src[3] != dst[3] {
			return fmt.Errorf("not one process going on from a count of 3 or more in %s to the next in %s:\n%s", srcPod, dstPod, out)
		}
		return nil
	}
}

// gateHeld: the pod is not Ready and cri-shim's readiness gate is False
// with reason BackoffHold (a restart held by the backoff).
func gateHeld(out string) error {
	for _, r := range table(out) {
		if r["NAME"] == "demo-api-restart" && r["READY"] == "False" && r["GATE"] == "False" && r["REASON"] == "BackoffHold" {
			return nil
		}
	}
	return fmt.Errorf("not seen during a hold yet:\n%s", out)
}

// restartEvents: cri-shim's events of the in-place restart.
func restartEvents(out string) error {
	for _, reason := range []string{"RestartAllContainersInPlace", "RestartedInPlace"} {
		if !strings.Contains(out, reason) {
			return fmt.Errorf("no %s event:\n%s", reason, out)
		}
	}
	return nil
}

// podCheckpointReady: the object is held by the node and Ready.
func podCheckpointReady(out string) error {
	rows := table(out)
	if len(rows) != 1 || rows[0]["READY"] != "True" || rows[0]["REASON"] != "CheckpointCompleted" || rows[0]["NODE"] == "" {
		return fmt.Errorf("not Ready:\n%s", out)
	}
	return nil
}

// orchestrated: the orchestrator's log ends with worker's EXITED and STARTED
// again after its "restart worker" command.
func orchestrated(out string) error {
	if !strings.Contains(out, "container=worker type=EXITED") || !regexp.MustCompile(`container=worker type=STARTED .*restarts=1`).MatchString(out) {
		return fmt.Errorf("no EXITED and STARTED (restarts=1) of worker:\n%s", out)
	}
	return nil
}

// TestDemo runs `make run`'s demo on the test node (its shim config, its
// script, its manifests) and each command it prints, checking that each
// shows its feature working: an in-place restart, a crash loop on the shim's
// curve, a warm start from a checkpoint and an orchestrator sidecar.
func TestDemo(t *testing.T) {
	longOnly(t, "make run's demo re-checks features that have their own tests")
	needKubelet(t)
	cs := needAPIServer(t)
	extra, err := os.ReadFile(filepath.Join(node.repo, "deploy", "examples", "demo", "cri-shim.toml"))
	if err != nil {
		t.Fatal(err)
	}
	// As make run: the demo's config, the shim acting as the node
	// (up.sh --shim-api), the kubelet registered with the API server.
	withShimConfig(t, string(extra)+fmt.Sprintf("\n[kubernetes]\nkubeconfig = %q\nnode_name = %q\n", node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"]))
	apiKubelet(t, cs)
	enableGate(t, cs, testNamespace(t, cs, "e2e-demo"))
	// The demo's API objects go before the kubelet and the shim's API
	// config do: the shim removes the PodCheckpoint's finalizer, and no
	// later kubelet in API mode runs the pods again.
	t.Cleanup(func() {
		zero := int64(0)
		for _, p := range []string{"demo-api-restart", "demo-api-counter", "demo-api-warm"} {
			_ = cs.CoreV1().Pods(demoNS).Delete(ctxT(t, 10*time.Second), p, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		pcs := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
		_ = pcs.Delete(ctxT(t, 10*time.Second), demoNS, "demo-api-counter-cp")
		eventually(t, time.Minute, "the demo's API pods and PodCheckpoint gone", func() error {
			l, err := cs.CoreV1().Pods(demoNS).List(ctxT(t, 10*time.Second), metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, p := range l.Items {
				if strings.HasPrefix(p.Name, "demo-api-") {
					return fmt.Errorf("pod %s still there", p.Name)
				}
			}
			if _, err := pcs.Get(ctxT(t, 10*time.Second), demoNS, "demo-api-counter-cp"); !apierrors.IsNotFound(err) {
				return fmt.Errorf("PodCheckpoint still there: %v", err)
			}
			return nil
		})
	})
	t.Cleanup(func() {
		pauseKubelet(t) // the demo's static pods and their containers
		os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], "demo-counter-warm"))
	})
	images := imagesSnapshot(t)
	start := time.Now()
	cmds := demoCommands(t)
	t.Logf("demo up in %.1fs", time.Since(start).Seconds())
	checks := []struct {
		feature string
		ok      func(string) error
		timeout time.Duration
	}{
		// main works 55 s, then the restart waits out the pod's first delay.
		{"in-place restart", inPlaceRestarted, 100 * time.Second},
		{"crash loop on the shim's curve", crashLoopOnCurve, 30 * time.Second},
		{"warm start from a checkpoint", warmStarted("demo-counter-", "demo-warm-"), 10 * time.Second},
		{"orchestrator sidecar", orchestrated, 10 * time.Second},
		// main exits every 20 s; holds of 1 to 5 s follow.
		{"the readiness gate during a hold", gateHeld, 90 * time.Second},
		{"the restart's events", restartEvents, 30 * time.Second},
		{"a PodCheckpoint Ready", podCheckpointReady, 10 * time.Second},
		{"a restore by PodCheckpoint name", warmStarted("demo-api-counter", "demo-api-warm"), 10 * time.Second},
	}
	for i, c := range checks {
		var out string
		eventually(t, c.timeout, c.feature+" shown by "+cmds[i], func() error {
			out = sh(t, cmds[i])
			return c.ok(out)
		})
		t.Logf("%s: $ %s\n%s", c.feature, cmds[i], out)
	}
	// A static pod's conditions land on its mirror pod (the sandbox carries
	// the static pod's config hash as UID, the mirror a UID of its own).
	mirror := fullName("demo-restart")
	mirrorWritten := false
	defer func() {
		if !mirrorWritten {
			logAbout(t, "demo-restart", 20)
		}
	}()
	eventually(t, 30*time.Second, "cri-shim's condition on the mirror pod of "+mirror, func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctxT(t, 10*time.Second), mirror, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == podstatus.ReadyCondition {
				t.Logf("mirror pod %s (uid %s, of %s): %s %s %s", mirror, p.UID, p.Annotations["kubernetes.io/config.mirror"], c.Type, c.Status, c.Reason)
				return nil
			}
		}
		return fmt.Errorf("no %s condition: %+v", podstatus.ReadyCondition, p.Status.Conditions)
	})
	mirrorWritten = true
	assertNoImageChange(t, images, "the demo, its warm start of demo-warm included")
}
