package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const demoPod = "cri-shim-demo"

// demoPodName is the static pod's name as the kubelet reports it (name-nodeName).
func demoPodName() string { return demoPod + "-" + envOr("CRI_SHIM_NODE_NAME", "cri-shim-node") }

// ensureDemoPod places deploy/examples/demo-pod.yaml as a static pod and waits
// until the kubelet reports it Running with every container up.
func ensureDemoPod(t testing.TB) *corev1.Pod {
	t.Helper()
	needKubelet(t)
	src := filepath.Join(node.repo, "deploy", "examples", "demo-pod.yaml")
	dst := filepath.Join(node.env["MANIFESTS"], "demo-pod.yaml")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if cur, err := os.ReadFile(dst); err != nil || string(cur) != string(b) {
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var pod *corev1.Pod
	eventually(t, 120*time.Second, "the demo pod to run", func() error {
		p, err := kubeletPod(t, demoPodName())
		if err != nil {
			return err
		}
		if err := podUp(p); err != nil {
			return err
		}
		pod = p
		return nil
	})
	return pod
}

// podUp: phase Running, init container completed, sidecar and main running.
func podUp(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("phase %s", p.Status.Phase)
	}
	want := map[string]bool{"init": false, "sidecar": false, "main": false}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		switch cs.Name {
		case "init":
			if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
				return fmt.Errorf("init container: %+v", cs.State)
			}
		default:
			if cs.State.Running == nil {
				return fmt.Errorf("%s not running: %+v", cs.Name, cs.State)
			}
		}
		want[cs.Name] = true
	}
	for n, seen := range want {
		if !seen {
			return fmt.Errorf("no status for container %s", n)
		}
	}
	return nil
}

func containerID(p *corev1.Pod, name string) string {
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if cs.Name == name {
			return strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	return ""
}

func TestKubeletRunsStaticPodThroughShim(t *testing.T) {
	// A demo pod of its own, created under the shim that runs now: the
	// shim's request counters checked below start with its process, and a
	// demo pod left by another test may predate it.
	needNode(t)
	pauseKubelet(t)
	pod := ensureDemoPod(t)
	ns := pod.Namespace
	// Logs through the kubelet (it reads the CRI log files the runtime wrote).
	eventually(t, 20*time.Second, "main's logs through the kubelet", func() error {
		out, err := kubeletDo(t, http.MethodGet, fmt.Sprintf("/containerLogs/%s/%s/main", ns, pod.Name))
		if err != nil {
			return err
		}
		if !strings.Contains(out, "main tick") {
			return fmt.Errorf("logs: %q", out)
		}
		return nil
	})
	out, err := kubeletDo(t, http.MethodGet, fmt.Sprintf("/containerLogs/%s/%s/init", ns, pod.Name))
	if err != nil || !strings.Contains(out, "init done") {
		t.Fatalf("init container logs: %q %v", out, err)
	}
	// Exec through the kubelet (/run: CRI ExecSync through the shim).
	out, err = kubeletDo(t, http.MethodPost, fmt.Sprintf("/run/%s/%s/main?cmd=cat+/work/init.log", ns, pod.Name))
	if err != nil || !strings.Contains(out, "init ran at") {
		t.Fatalf("exec through the kubelet: %q %v", out, err)
	}
	// The kubelet's view and the runtime's agree: the sandbox is the one containerd runs.
	sb, err := crictl(t, node.env["CONTAINERD_SOCK"], "pods", "--name", demoPod, "--state", "ready", "-q")
	if err != nil || len(strings.Fields(sb)) != 1 {
		t.Fatalf("containerd sees %q ready sandboxes for the demo pod (%v)", sb, err)
	}
	// The shim counted the kubelet's calls.
	metrics := scrapeMetrics(t)
	for _, m := range []string{"RuntimeService/RunPodSandbox", "RuntimeService/CreateContainer", "RuntimeService/StartContainer", "RuntimeService/ListContainers", "RuntimeService/ExecSync"} {
		if !strings.Contains(metrics, `cri_shim_grpc_requests_total{method="runtime.v1.`+m+`"}`) {
			t.Errorf("metrics have no request count for %s", m)
		}
	}
}

// Kill -9 containerd under a running kubelet and shim, then start it again:
// the shim answers Unavailable meanwhile, serves again by itself, and the pod
// is still the same pod with the same containers.
func TestContainerdRestartSurvived(t *testing.T) {
	before := ensureDemoPod(t)
	mainID := containerID(before, "main")
	sandboxes := strings.Fields(mustCrictl(t, node.env["SHIM_SOCK"], "pods", "--name", demoPod, "--state", "ready", "-q"))
	if len(sandboxes) != 1 {
		t.Fatalf("want one ready sandbox, got %v", sandboxes)
	}
	pidB, err := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidB)))
	keepRunning(t, "containerd")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "containerd to exit", func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("pid %d alive", pid)
		}
		return nil
	})
	shim := runtimeClient(t, node.env["SHIM_SOCK"])
	start := time.Now()
	_, err = shim.Version(ctxT(t, 5*time.Second), &runtimeapi.VersionRequest{})
	took := time.Since(start)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("with containerd down the shim answered %v, want Unavailable", err)
	}
	if took > time.Second {
		t.Errorf("Unavailable took %v; must be prompt", took)
	}
	t.Logf("containerd down: shim answered %s in %v", status.Code(err), took.Round(time.Microsecond))
	if _, err := kubeletDo(t, http.MethodGet, "/pods"); err != nil {
		t.Fatalf("kubelet API while containerd is down: %v", err)
	}
	resp, err := http.Get("http://" + node.env["SHIM_METRICS"] + "/readyz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/readyz with containerd down: %s", resp.Status)
		}
	}

	restart := time.Now()
	if err := script("up.sh", "--start", "containerd"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the shim to serve again without a restart", func() error {
		_, err := shim.Version(ctxT(t, 2*time.Second), &runtimeapi.VersionRequest{})
		return err
	})
	t.Logf("shim served again %v after containerd was restarted", time.Since(restart).Round(time.Millisecond))

	after := strings.Fields(mustCrictl(t, node.env["SHIM_SOCK"], "pods", "--name", demoPod, "--state", "ready", "-q"))
	if len(after) != 1 || after[0] != sandboxes[0] {
		t.Fatalf("sandbox changed across the containerd restart: %v -> %v", sandboxes, after)
	}
	eventually(t, 60*time.Second, "the kubelet to report the same pod running", func() error {
		p, err := kubeletPod(t, demoPodName())
		if err != nil {
			return err
		}
		if err := podUp(p); err != nil {
			return err
		}
		if id := containerID(p, "main"); id != mainID {
			return fmt.Errorf("main container changed: %s -> %s", mainID, id)
		}
		return nil
	})
}

func scrapeMetrics(t testing.TB) string {
	t.Helper()
	resp, err := http.Get("http://" + node.env["SHIM_METRICS"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return sb.String()
}
