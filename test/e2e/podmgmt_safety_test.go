package e2e

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// refusedMetric is cri_shim_podmgmt_channel_refused_total for a reason (0 if absent).
func refusedMetric(t *testing.T, reason string) float64 {
	t.Helper()
	v := metricValue(scrapeMetrics(t), `cri_shim_podmgmt_channel_refused_total{reason="`+reason+`"}`)
	return max(v, 0)
}

// A hostNetwork pod that declares an orchestrator gets no channel: the shim
// (root) never connects to the host port the annotation names, where any
// local process could listen and receive the pod's token and events; the
// refusal is counted.
func TestPodManagementHostNetworkRefused(t *testing.T) {
	needKubelet(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	before := refusedMetric(t, "host_network")
	name := "orch-hostnet"
	placeManifest(t, name, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  annotations:
    pod-management.cri-shim.io/orch: '{"port": %[2]d, "version": "1.0"}'
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: orch
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
`, name, port))
	p := waitRunning(t, name, 90*time.Second, 0, "orch", "main")
	// The refusal is the shim's decision on this pod's channel (made when
	// the kubelet ran the sandbox). A connector would start when orch
	// started and dial at once (the code before a4e2e3d did); the kubelet
	// has seen main, started after orch, running, and two more of its
	// relists pass through the shim: any such dial would have come by then.
	eventually(t, 30*time.Second, "the refusal counted", func() error {
		if after := refusedMetric(t, "host_network"); after < before+1 {
			return fmt.Errorf("cri_shim_podmgmt_channel_refused_total{reason=\"host_network\"} %v -> %v, want the refusal counted", before, after)
		}
		return nil
	})
	kubeletRelists(t, 2)
	if n := conns.Load(); n != 0 {
		t.Fatalf("the shim made %d connections to 127.0.0.1:%d for host-network pod %s", n, port, name)
	}
	t.Logf("pod IP %q (host network); refusal counted; no connection by the kubelet's second relist after main ran", p.Status.PodIP)
}

// kubeletRelists waits for n more of the kubelet's relists (its PLEG lists
// the sandboxes every second) to pass through the shim: a point the node's
// work of the last moments is behind.
func kubeletRelists(t *testing.T, n int) {
	t.Helper()
	const relist = `cri_shim_grpc_requests_total{method="runtime.v1.RuntimeService/ListPodSandbox"}`
	from := metricValue(scrapeMetrics(t), relist)
	eventually(t, 30*time.Second, fmt.Sprintf("%d relists of the kubelet through the shim", n), func() error {
		if now := metricValue(scrapeMetrics(t), relist); now < from+float64(n) {
			return fmt.Errorf("%v ListPodSandbox calls, from %v", now, from)
		}
		return nil
	})
}

// A container the orchestrator terminated stays terminated although its
// Restart rule (NotIn [0]) would restart it within a second or two, until
// the orchestrator restarts it. A control container, ctl, has the same rule
// and exits 3 by itself once main is held: its restart by the rule shows
// that main's would have come by then.
func TestPodManagementTerminateSticks(t *testing.T) {
	needKubelet(t)
	kubeletLog := filepath.Join(node.env["NODE_RUN"], "kubelet.log")
	logFrom := fileSize(kubeletLog) // only this test's part of the log
	bin := buildOrchestrator(t)
	name := "orch-hold"
	rule := `'[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]'`
	placeManifest(t, name, orchPodWith(name, bin, 50053, true,
		"    restart-rules.cri-shim.io/main: "+rule+"\n    restart-rules.cri-shim.io/ctl: "+rule+"\n",
		`  - name: keep
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
  - name: ctl
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while [ ! -e /tmp/exit ]; do sleep 0.2; done; exit 3"]
`))
	p := waitRunning(t, name, 90*time.Second, 0, "orch", "main", "keep", "ctl")
	full := fullName(name)
	waitLog(t, full, "STARTED for main", 30*time.Second, func(s string) bool { return strings.Contains(s, "container=main type=STARTED") })

	command(t, p, "terminate main 3")
	waitLog(t, full, "main terminated", 30*time.Second, func(s string) bool {
		return strings.Contains(s, `command "terminate main 3": ACCEPTED`) && strings.Contains(s, "container=main type=EXITED exit=3")
	})
	terminatedAt := time.Now()
	// held checks that main stays exited, as the kubelet sees it and as the
	// runtime has it.
	held := func() {
		q, err := kubeletPod(t, full)
		if err != nil {
			t.Fatal(err)
		}
		s := statusOf(q, "main")
		if s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 3 || s.RestartCount != 0 {
			t.Fatalf("%.1fs after the orchestrator terminated main, the kubelet sees %+v: restarted by the rule", time.Since(terminatedAt).Seconds(), s)
		}
		if n := mainRunning(t, q); n != 0 {
			t.Fatalf("%.1fs after the orchestrator terminated main, the runtime runs %d instance(s) of it", time.Since(terminatedAt).Seconds(), n)
		}
		if s := orchLog(t, full); strings.Contains(s, "container=main type=STARTED exit=0 restarts=1") {
			t.Fatalf("main restarted while held:\n%s", lastLines(s, 10))
		}
	}
	eventually(t, 15*time.Second, "the kubelet seeing main terminated with 3", func() error {
		q, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if s := statusOf(q, "main"); s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 3 {
			return fmt.Errorf("main %+v", s.State)
		}
		return nil
	})
	execIn(t, p, "ctl", "touch /tmp/exit")
	waitLog(t, full, "ctl exiting 3 and restarted by its rule, main held meanwhile", 30*time.Second, func(s string) bool {
		held()
		return strings.Contains(s, "container=ctl type=EXITED exit=3") && strings.Contains(s, "container=ctl type=STARTED exit=0 restarts=1")
	})
	held()
	heldFor := time.Since(terminatedAt)

	// The orchestrator restarts it: in place, in the same sandbox.
	command(t, p, "restart main")
	waitLog(t, full, "main restarted on command", 60*time.Second, func(s string) bool {
		return strings.Contains(s, `command "restart main": ACCEPTED`) && strings.Contains(s, "container=main type=STARTED exit=0 restarts=1")
	})
	eventually(t, 30*time.Second, "main running again in the runtime", func() error {
		q, err := kubeletPod(t, full)
		if err != nil {
			return err
		}
		if n := mainRunning(t, q); n != 1 {
			return fmt.Errorf("%d running instances of main", n)
		}
		return nil
	})
	// Under restartPolicy Never the kubelet refuses to show main running
	// again (docs/pod-management.md): its status manager drops the update,
	// saying so in its log, and keeps main's terminated instance.
	refusal := "terminated container main attempted illegal transition to non-terminated state"
	eventually(t, 30*time.Second, "the kubelet refusing to show main running again", func() error {
		for _, l := range strings.Split(readFrom(kubeletLog, logFrom), "\n") {
			if strings.Contains(l, refusal) && strings.Contains(l, full) {
				return nil
			}
		}
		return fmt.Errorf("no %q for %s in the kubelet's log yet", refusal, full)
	})
	q, err := kubeletPod(t, full)
	if err != nil {
		t.Fatal(err)
	}
	if s := statusOf(q, "main"); s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 3 {
		t.Errorf("after the orchestrator's restart the kubelet shows main as %+v, want its terminated instance (exit 3) kept", s)
	}
	t.Logf("held %.0fs (until ctl's restart by the same rule); after the orchestrator's restart the kubelet shows main as %+v; kubelet log lines refusing a terminated->running transition: %d",
		heldFor.Seconds(), statusOf(q, "main").State, strings.Count(readFrom(kubeletLog, logFrom), refusal))
}

// mainRunning counts the running instances of main in the pod's sandbox.
func mainRunning(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	sb := strings.TrimSpace(mustCrictl(t, node.env["SHIM_SOCK"], "pods", "-q", "--name", p.Name, "--namespace", p.Namespace, "--state", "ready"))
	if sb == "" {
		t.Fatalf("no ready sandbox for %s", p.Name)
	}
	out := strings.TrimSpace(mustCrictl(t, node.env["SHIM_SOCK"], "ps", "-q", "--pod", strings.Fields(sb)[0], "--name", "^main$", "--state", "running"))
	if out == "" {
		return 0
	}
	return len(strings.Fields(out))
}
