package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// triggerPod: main runs until the test creates /t/exit on the host, then
// exits 1; its rule restarts it on every failure (Restart, NotIn [0]) under
// restartPolicy Never, so a kubelet that saw the exit would fail the pod.
func triggerPod(name string) string {
	dir := filepath.Join(node.env["NODE_DATA"], "bench", name)
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  annotations:
    restart-rules.cri-shim.io/main: '[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]'
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "n=$(cat /t/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > /t/count; echo start $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; while [ ! -f /t/exit ]; do sleep 0.2; done; rm -f /t/exit; exit 1"]
    volumeMounts: [{name: t, mountPath: /t}]
  volumes:
  - name: t
    hostPath: {path: %[2]s, type: DirectoryOrCreate}
`, name, dir)
}

func readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + node.env["SHIM_METRICS"] + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Issue 14 item 9 on the real stack: while the pod's state record cannot be
// written (its slot files made immutable: even root's writes fail), a
// governed exit starts no restart and the kubelet does not see it (the pod
// under restartPolicy Never does not fail), /readyz is 503 naming the write
// and the failures are counted; once writes succeed the restart happens and
// the shim is ready again.
func TestStateWriteFailureRefusesRestart(t *testing.T) {
	needKubelet(t)
	name := "state-unwritable"
	dir := filepath.Join(node.env["NODE_DATA"], "bench", name)
	_ = os.RemoveAll(dir)
	placeManifest(t, name, triggerPod(name))
	full := fullName(name)
	eventually(t, 90*time.Second, name+" running", func() error {
		p, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if cs := statusOf(p, "main"); cs == nil || cs.State.Running == nil {
			return fmt.Errorf("main not running yet")
		}
		if starts, _ := stamps(name); len(starts) != 1 {
			return fmt.Errorf("%d starts", len(starts))
		}
		return nil
	})
	// The pod's two slots (written at RunPodSandbox and CreateContainer).
	slots := podSlots(t, full)
	chattr := func(flag string) {
		for _, s := range slots {
			if out, err := exec.Command("chattr", flag, s).CombinedOutput(); err != nil {
				t.Fatalf("chattr %s %s: %v %s", flag, s, err, out)
			}
		}
	}
	chattr("+i")
	t.Cleanup(func() { chattr("-i") })
	t.Cleanup(func() {
		b, _ := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.log"))
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, full) || strings.Contains(l, "state write") {
				t.Logf("shim: %.300s", l)
			}
		}
	})
	errsBefore := metricValue(scrapeMetrics(t), "cri_shim_state_write_errors_total")

	if err := os.WriteFile(filepath.Join(dir, "exit"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "/readyz to report the failing write", func() error {
		if code, body := readyz(t); code != http.StatusServiceUnavailable || !strings.Contains(body, "state not writable") {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
	m := scrapeMetrics(t)
	if v := metricValue(m, "cri_shim_state_write_errors_total"); v <= errsBefore {
		t.Errorf("cri_shim_state_write_errors_total %v, was %v: the failed writes are not counted", v, errsBefore)
	}
	if v := metricValue(m, "cri_shim_state_writable"); v != 0 {
		t.Errorf("cri_shim_state_writable %v, want 0", v)
	}
	// Ten seconds of an exit the shim could not record: no restart, and the
	// kubelet never acts on it (it would fail the pod).
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if starts, _ := stamps(name); len(starts) != 1 {
			t.Fatalf("main started %d times while its restart could not be recorded", len(starts))
		}
		if p, err := kubeletPod(t, full); err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) {
			t.Fatalf("the kubelet acted on the unrecorded exit: pod %s", p.Status.Phase)
		}
	}

	chattr("-i")
	eventually(t, 30*time.Second, "the restart once writes succeed", func() error {
		if starts, _ := stamps(name); len(starts) != 2 {
			return fmt.Errorf("%d starts", len(starts))
		}
		p, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if cs := statusOf(p, "main"); cs == nil || cs.State.Running == nil || cs.RestartCount != 1 {
			return fmt.Errorf("main %+v", cs)
		}
		return nil
	})
	if code, body := readyz(t); code != http.StatusOK {
		t.Fatalf("/readyz after writes recovered: %d %q", code, body)
	}
	if v := metricValue(scrapeMetrics(t), "cri_shim_state_writable"); v != 1 {
		t.Errorf("cri_shim_state_writable %v after recovery, want 1", v)
	}
}

// podSlots returns the two state slots of the pod named full.
func podSlots(t *testing.T, full string) []string {
	t.Helper()
	var slots []string
	eventually(t, 10*time.Second, "the state slots of "+full, func() error {
		slots = nil
		files, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "cri-shim", "store", "podstate", "*.[01]"))
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), `"name":"`+full+`"`) {
				slots = append(slots, f)
			}
		}
		if len(slots) != 2 {
			return fmt.Errorf("slots %v", slots)
		}
		return nil
	})
	return slots
}
