package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
)

// warmPod is a pod with a completed init container, a running sidecar and a
// main container, the last two printing counters; restoreFrom, when set,
// names the checkpoint to warm-start it from.
func warmPodManifest(name, restoreFrom string) string {
	counter := `["sh", "-c", "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done"]`
	ann := ""
	if restoreFrom != "" {
		ann = fmt.Sprintf("  annotations:\n    %s: %q\n", podspec.RestoreFromKey, restoreFrom)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
%sspec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: init
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "echo init ran"]
  - name: sidecar
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    restartPolicy: Always
    command: %s
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: %s
`, name, ann, counter, counter)
}

// podLog is the kubelet's log file of a container's first instance.
func podLog(t *testing.T, pod, container string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", "default_"+pod+"_*", container, "0.log"))
	if len(m) != 1 {
		return ""
	}
	return m[0]
}

// Acceptance 2 and 4, with a standalone kubelet v1.36 that knows nothing of
// checkpoints: a static pod whose annotation names a checkpoint that does not
// exist yet stays Pending with a clear message; once 'cri-shim checkpoint'
// writes it, the pod comes up with its counters resumed, its completed init
// container shown completed and not run again, and its sidecar running.
func TestWarmStartUnderKubelet(t *testing.T) {
	needKubelet(t)
	const cp = "e2e-warm"
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp))
	t.Cleanup(func() { os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp)) })
	placeManifest(t, "warm-src", warmPodManifest("warm-src", ""))
	placeManifest(t, "warm-dst", warmPodManifest("warm-dst", cp))
	waitRunning(t, "warm-src", 90*time.Second, 0, "sidecar", "main")

	// The checkpoint does not exist: Pending, and the kubelet says why.
	eventually(t, 60*time.Second, "the kubelet reporting the missing checkpoint", func() error {
		b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "kubelet.log"))
		if !strings.Contains(string(b), cp) || !strings.Contains(string(b), "does not exist") || !strings.Contains(string(b), "the pod stays pending and the kubelet retries") {
			return fmt.Errorf("no message about %s in kubelet.log yet", cp)
		}
		return nil
	})
	if p, err := kubeletPod(t, fullName("warm-dst")); err == nil && p.Status.Phase != corev1.PodPending {
		t.Fatalf("warm-dst is %s without its checkpoint, want Pending", p.Status.Phase)
	}

	src := fullName("warm-src")
	eventually(t, 30*time.Second, "source counting to 30", func() error {
		if lastCounter(t, podLog(t, src, "main")) < 30 {
			return fmt.Errorf("main at %d", lastCounter(t, podLog(t, src, "main")))
		}
		return nil
	})
	before := map[string]int{}
	for _, c := range []string{"sidecar", "main"} {
		before[c] = lastCounter(t, podLog(t, src, c))
	}
	images := imagesSnapshot(t)
	out, err := exec.Command(node.env["SHIM_BIN"], "checkpoint", "--config", node.env["SHIM_CONFIG"],
		"--namespace", "default", "--pod", src, "--name", cp, "--timeout", "60s").CombinedOutput()
	if err != nil {
		t.Fatalf("cri-shim checkpoint: %v\n%s", err, out)
	}
	t.Logf("cri-shim checkpoint:\n%s", out)
	checkpointed := time.Now()
	list, err := exec.Command(node.env["SHIM_BIN"], "checkpoints", "--config", node.env["SHIM_CONFIG"]).CombinedOutput()
	if err != nil || !strings.Contains(string(list), cp) || !strings.Contains(string(list), "sidecar,main") {
		t.Fatalf("cri-shim checkpoints: %v\n%s", err, list)
	}

	start := time.Now()
	p := waitRunning(t, "warm-dst", 120*time.Second, 0, "sidecar", "main")
	t.Logf("warm-dst Running %.1fs after the checkpoint was written (the kubelet's retry of the sandbox)", time.Since(start).Seconds())
	dst := fullName("warm-dst")
	for _, c := range []string{"sidecar", "main"} {
		all, first := countersLoggedSince(t, func() string { return podLog(t, dst, c) }, checkpointed)
		if first < before[c] {
			t.Fatalf("%s: the warm-started process logged %d first; the source was at %d before the checkpoint (started from scratch?)", c, first, before[c])
		}
		t.Logf("%s: source at %d before the checkpoint; warm-started process went on from %d to %d", c, before[c], first, all[len(all)-1])
	}
	init := statusOf(p, "init")
	if init == nil || init.State.Terminated == nil || init.State.Terminated.ExitCode != 0 {
		t.Fatalf("init container: %+v, want terminated with 0", init)
	}
	b, _ := os.ReadFile(podLog(t, dst, "init"))
	if strings.Contains(string(b), "init ran") || !strings.Contains(string(b), "not run again") {
		t.Fatalf("init container of the warm-started pod ran its own command again: %q", b)
	}
	assertNoImageChange(t, images, "the warm start of "+dst)
	// The source keeps running.
	if p, err := kubeletPod(t, src); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("source pod: %v %v", p.Status.Phase, err)
	}
}
