package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// buildOrchestrator builds examples/orchestrator (static) into a directory the
// test pods mount.
func buildOrchestrator(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(node.env["NODE_DATA"], "orchestrator")
	os.MkdirAll(dir, 0o755)
	b := exec.Command("go", "build", "-o", filepath.Join(dir, "orchestrator"), "./examples/orchestrator")
	b.Dir, b.Env = node.repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("build orchestrator: %v\n%s", err, out)
	}
	return dir
}

func orchPod(name, binDir string, port int, listen bool) string {
	return orchPodWith(name, binDir, port, listen, "", "")
}

// orchPodWith is orchPod with more annotations (lines of the annotations map)
// and more containers (list items of spec.containers).
func orchPodWith(name, binDir string, port int, listen bool, annotations, containers string) string {
	orch := fmt.Sprintf(`["/orch/orchestrator", "--port", "%d", "--commands", "/work/cmd"]`, port)
	if !listen {
		orch = `["sh", "-c", "sleep 3600"]`
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  annotations:
    pod-management.cri-shim.io/orch: '{"port": %[2]d, "version": "1.0"}'
%[5]sspec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: orch
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    restartPolicy: Always
    command: %[3]s
    volumeMounts: [{name: orch, mountPath: /orch}, {name: work, mountPath: /work}]
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 9' TERM; while true; do sleep 0.2; done"]
%[6]s  volumes:
  - name: orch
    hostPath: {path: %[4]s, type: Directory}
  - name: work
    emptyDir: {}
`, name, port, orch, binDir, annotations, containers)
}

// orchLog is everything the orchestrator printed, over all its instances.
func orchLog(t *testing.T, pod string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", "default_"+pod+"_*", "orch", "*.log"))
	var b strings.Builder
	for _, f := range m {
		x, _ := os.ReadFile(f)
		b.Write(x)
	}
	return b.String()
}

func waitLog(t *testing.T, pod, what string, timeout time.Duration, pred func(string) bool) {
	t.Helper()
	eventually(t, timeout, what, func() error {
		if pred(orchLog(t, pod)) {
			return nil
		}
		return fmt.Errorf("not yet; orchestrator log ends:\n%s", lastLines(orchLog(t, pod), 6))
	})
}

// command appends a command line to the orchestrator's command file (the
// pod's emptyDir, on the host).
func command(t *testing.T, p *corev1.Pod, line string) {
	t.Helper()
	f := filepath.Join(node.env["NODE_DATA"], "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", "work", "cmd")
	fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(fh, line)
	fh.Close()
}

// Acceptance 1-4 and 6 with kubelet v1.36 and the example orchestrator.
func TestPodManagementChannel(t *testing.T) {
	needKubelet(t)
	bin := buildOrchestrator(t)
	name := "orch-e2e"
	placeManifest(t, name, orchPod(name, bin, 50051, true))
	p := waitRunning(t, name, 90*time.Second, 0, "orch", "main")
	full := fullName(name)
	sandbox := p.Status.PodIP

	// 1. STARTED for every container.
	waitLog(t, full, "STARTED for orch and main", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "container=orch type=STARTED") && strings.Contains(s, "container=main type=STARTED")
	})

	// 6. A call with a wrong token is rejected by the orchestrator.
	conn, err := grpc.NewClient(net.JoinHostPort(p.Status.PodIP, "50051"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(ctxT(t, 10*time.Second), podmanagement.TokenMetadata, "not-the-token")
	_, err = pb.NewPodManagementClient(conn).NotifyContainerEvent(ctx, &pb.NotifyContainerEventRequest{Event: &pb.ContainerEvent{ContainerName: "main", Type: pb.EventType_EXITED}})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged notification: %v, want Unauthenticated", err)
	}
	waitLog(t, full, "the orchestrator reporting the rejection", 10*time.Second, func(s string) bool { return strings.Contains(s, "rejected 1 calls") })

	// 3. Restart main: notified of its exit (its own code, 9, on SIGTERM) and restart.
	command(t, p, "restart main")
	waitLog(t, full, "main restarted", 60*time.Second, func(s string) bool {
		return strings.Contains(s, `command "restart main": ACCEPTED`) && strings.Contains(s, "container=main type=EXITED exit=9") &&
			strings.Contains(s, "container=main type=STARTED exit=0 restarts=1")
	})
	// ... then the whole pod, in place.
	command(t, p, "restart-all e2e")
	eventually(t, 90*time.Second, "pod restarted in place", func() error {
		q, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if s := statusOf(q, "orch"); s == nil || s.RestartCount < 1 || s.State.Running == nil {
			return fmt.Errorf("orch %v", s)
		}
		if s := statusOf(q, "main"); s == nil || s.RestartCount < 2 || s.State.Running == nil {
			return fmt.Errorf("main %v", s)
		}
		if q.Status.PodIP != sandbox {
			t.Fatalf("pod IP changed from %s to %s: not in place", sandbox, q.Status.PodIP)
		}
		return nil
	})
	// The restarted orchestrator got the state again (the connection is new).
	waitLog(t, full, "state resent to the restarted orchestrator", 30*time.Second, func(s string) bool {
		return strings.Count(s, `message="resync"`) >= 2
	})

	// 4. The orchestrator killed: restarted by the kubelet, the shim reconnects and resends.
	q, _ := kubeletPod(t, full)
	nextLog := filepath.Join(node.env["NODE_DATA"], "pod-logs", "default_"+full+"_"+string(q.UID), "orch", strconv.Itoa(int(statusOf(q, "orch").RestartCount)+1)+".log")
	out := mustCrictl(t, node.env["SHIM_SOCK"], "inspect", "-o", "go-template", "--template", "{{.info.pid}}", strings.TrimPrefix(statusOf(q, "orch").ContainerID, "containerd://"))
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("orchestrator pid: %q", out)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "state resent to the orchestrator started after the kill", func() error {
		b, _ := os.ReadFile(nextLog)
		if strings.Count(string(b), `message="resync"`) < 2 {
			return fmt.Errorf("%s:\n%s", filepath.Base(nextLog), lastLines(string(b), 5))
		}
		return nil
	})

	// 2. Terminate main with 0: it exits, and the pod (restartPolicy Never) completes.
	command(t, p, "terminate main 0")
	eventually(t, 60*time.Second, "pod completed", func() error {
		q, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if q.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s", q.Status.Phase)
		}
		return nil
	})
	if s := orchLog(t, full); !strings.Contains(s, `command "terminate main 0": ACCEPTED`) {
		t.Fatalf("orchestrator log:\n%s", lastLines(s, 10))
	}
}

// Acceptance 5: a declared orchestrator that never listens delays nothing.
func TestPodManagementSidecarNeverListening(t *testing.T) {
	needKubelet(t)
	bin := buildOrchestrator(t)
	name := "orch-silent"
	start := time.Now()
	placeManifest(t, name, orchPod(name, bin, 50052, false))
	p := waitRunning(t, name, 90*time.Second, 0, "orch", "main")
	orch, main := statusOf(p, "orch").State.Running.StartedAt.Time, statusOf(p, "main").State.Running.StartedAt.Time
	if d := main.Sub(orch); d > 5*time.Second {
		t.Fatalf("main started %s after the silent orchestrator", d)
	}
	t.Logf("pod running %.1fs after its manifest appeared; main started %s after the silent orchestrator", time.Since(start).Seconds(), main.Sub(orch))
}
