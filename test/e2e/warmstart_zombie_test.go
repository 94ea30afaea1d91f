package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// zombiePodManifest is a pod whose main process (PID 1, `sleep`) never
// reaps its one child, a `sleep 0` that exits at once: the pod always holds
// a zombie, which CRIU dumps with an uninitialized thread ID.
func zombiePodManifest(name, restoreFrom string) string {
	return mainPod(name, "default", restoreFrom, `["sh", "-c", "sleep 0 & exec sleep 3600"]`)
}

// A checkpoint of a pod holding an exited, unreaped child restores: the
// warm-started pod runs, and its main process still has the dead child.
// (The checks of the images once refused such a checkpoint for the dead
// child's thread ID; the e2e restores of counting pods failed whenever a
// `sleep` had just exited.)
func TestWarmStartWithAnUnreapedChild(t *testing.T) {
	needKubelet(t)
	const cp = "e2e-zombie"
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp))
	t.Cleanup(func() { os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp)) })
	placeManifest(t, "zombie-src", zombiePodManifest("zombie-src", ""))
	src := waitRunning(t, "zombie-src", 90*time.Second, 0, "main")
	eventually(t, 30*time.Second, "a dead child in zombie-src", func() error {
		if out, err := tryExec(t, src, "main", "ps -o pid,stat,comm"); err != nil || !zombieListed(out) {
			return fmt.Errorf("ps: %v\n%s", err, out)
		}
		return nil
	})
	out, err := exec.Command(node.env["SHIM_BIN"], "checkpoint", "--config", node.env["SHIM_CONFIG"],
		"--namespace", "default", "--pod", fullName("zombie-src"), "--name", cp, "--timeout", "60s").CombinedOutput()
	if err != nil {
		t.Fatalf("cri-shim checkpoint: %v\n%s", err, out)
	}
	placeManifest(t, "zombie-dst", zombiePodManifest("zombie-dst", cp))
	dst := waitRunning(t, "zombie-dst", 120*time.Second, 0, "main")
	ps := execIn(t, dst, "main", "ps -o pid,stat,comm")
	if !zombieListed(ps) {
		t.Fatalf("the warm-started pod has no dead child; was it restored?\n%s", ps)
	}
	if line := lastShimLogLine(t, node.env["NODE_RUN"], "warm start container", dst.Status.ContainerStatuses[0].ContainerID[len("containerd://"):]); line == "" {
		t.Fatalf("no warm start of zombie-dst's main in the shim's log")
	}
	t.Logf("zombie-dst restored from %s:\n%s", cp, ps)
}

// zombieListed: busybox ps lists a process in state Z.
func zombieListed(ps string) bool {
	for _, l := range strings.Split(ps, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && strings.HasPrefix(f[1], "Z") {
			return true
		}
	}
	return false
}
