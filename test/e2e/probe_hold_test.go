package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// probePod: main serves TCP 8080 (busybox httpd) for 3 s, then exits 1, every
// run, stamping the host's uptime at each start and exit; a Restart rule
// opts its failures into the shim's curve; a liveness probe (probe: an exec
// or tcpSocket block) checked every second fails once the process is dead.
// Its first check waits a second: one made as the container starts can find
// httpd not listening yet and have the kubelet kill a live instance, its own
// decision (seen once in 4 runs, 2026-11-27).
func probePod(name, probe string) string {
	dir := filepath.Join(node.env["NODE_DATA"], "bench", name)
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  annotations:
    restart-rules.cri-shim.io/main: '[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]'
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: ["sh", "-c", "n=$(cat /t/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > /t/count; echo start $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; httpd -f -p 8080 & sleep 3; echo exit $n $(cut -d' ' -f1 /proc/uptime) >> /t/t.log; exit 1"]
    livenessProbe:
%[3]s
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 1
      timeoutSeconds: 1
    volumeMounts: [{name: t, mountPath: /t}]
  volumes:
  - name: t
    hostPath: {path: %[2]s, type: DirectoryOrCreate}
`, name, dir, probe)
}

// liveWatch samples containerd's containers of one pod every 50 ms: the
// most instances of main that were CREATED or RUNNING at once, and every
// instance seen with its attempt.
type liveWatch struct {
	mu       sync.Mutex
	maxLive  int
	atMax    []string
	attempts map[string]uint32 // container ID -> attempt
	live     map[string]bool   // IDs CREATED or RUNNING in the last sample
	samples  int
}

// newestLive reports whether id was live in the last sample and is the
// newest instance (highest attempt) seen.
func (w *liveWatch) newestLive(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.attempts[id]
	if !ok || !w.live[id] {
		return false
	}
	for _, b := range w.attempts {
		if b > a {
			return false
		}
	}
	return true
}

// oneMoreSample waits for a sample taken after the call.
func (w *liveWatch) oneMoreSample(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	from := w.samples
	w.mu.Unlock()
	eventually(t, 10*time.Second, "a sample of containerd's containers", func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.samples < from+2 { // the one under way may have listed before the call
			return fmt.Errorf("%d samples", w.samples-from)
		}
		return nil
	})
}

func watchLive(ctx context.Context, rt runtimeapi.RuntimeServiceClient, pod string) *liveWatch {
	w := &liveWatch{attempts: map[string]uint32{}}
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := rt.ListContainers(lctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
				LabelSelector: map[string]string{"io.kubernetes.pod.name": pod, "io.kubernetes.container.name": "main"}}})
			cancel()
			if err != nil {
				continue
			}
			var live []string
			w.mu.Lock()
			w.live = map[string]bool{}
			for _, c := range resp.Containers {
				w.attempts[c.Id] = c.GetMetadata().GetAttempt()
				if c.State == runtimeapi.ContainerState_CONTAINER_CREATED || c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
					live = append(live, fmt.Sprintf("%.12s(attempt %d, %s)", c.Id, c.GetMetadata().GetAttempt(), c.State))
					w.live[c.Id] = true
				}
			}
			if len(live) > w.maxLive {
				w.maxLive, w.atMax = len(live), live
			}
			w.samples++
			w.mu.Unlock()
		}
	}()
	return w
}

// Item 11 of issue 14: a pod whose container crashes and has a liveness
// probe, under a Restart rule, while the shim holds the restart for its
// backoff delay. The kubelet sees the held instance running; a probe that
// fails on the dead process (tcpSocket: the kubelet dials the pod) makes it
// kill that instance and, under restartPolicy Always, create a new one at
// once. containerd must never hold two live instances of main, and the
// restarts must keep the shim's curve (6 s, then 12 s) with consecutive
// attempts. An exec probe errors on a dead container (ExecSync fails), which
// the kubelet's prober discards (pkg/kubelet/prober/worker.go): no kill.
func TestLivenessProbeDuringBackoffHold(t *testing.T) {
	needKubelet(t)
	withShimConfig(t, "[backoff]\ninitial_delay = \"6s\"\nmax_delay = \"12s\"\n")
	rt := runtimeClient(t, node.env["CONTAINERD_SOCK"])
	for _, tc := range []struct{ name, probe string }{
		{"tcp", "      tcpSocket: {port: 8080}"},
		{"exec", "      exec: {command: [\"true\"]}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A new name (so a new pod UID) per run: the shim's curve belongs to the pod UID.
			name := fmt.Sprintf("probe-hold-%s-%d", tc.name, time.Now().Unix()%100000)
			t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name)) })
			kubeletLog, shimLog := filepath.Join(node.env["NODE_RUN"], "kubelet.log"), filepath.Join(node.env["NODE_RUN"], "cri-shim.log")
			logBefore, shimBefore := fileSize(kubeletLog), fileSize(shimLog)
			defer func() {
				if t.Failed() {
					t.Logf("kubelet:\n%s\ncri-shim:\n%s", grepN(readFrom(kubeletLog, logBefore), 60, name, "iveness", "Killing", "ContainerStatus", "CreateContainer", "StartContainer", "StopContainer"),
						grepN(readFrom(shimLog, shimBefore), 60, "podstate"))
				}
			}()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := watchLive(ctx, rt, fullName(name))
			placeManifest(t, name, probePod(name, tc.probe))
			const restarts = 3
			eventually(t, 150*time.Second, fmt.Sprintf("%s to start %d times", name, restarts+1), func() error {
				starts, _ := stamps(name)
				if _, ok := starts[restarts+1]; !ok {
					return fmt.Errorf("%d starts", len(starts))
				}
				return nil
			})
			// A second instance would be the kubelet's create after its
			// liveness kill, made during the hold, before the shim's restart.
			// Once the kubelet reports main running as the instance the
			// restart made (live in containerd, the newest attempt), and one
			// more sample is taken, such a create is behind.
			eventually(t, 60*time.Second, "the kubelet reporting main's newest instance running", func() error {
				p, err := kubeletPod(t, fullName(name))
				if err != nil {
					return err
				}
				s := statusOf(p, "main")
				if s == nil || s.State.Running == nil {
					return fmt.Errorf("main %+v", s)
				}
				if id := strings.TrimPrefix(s.ContainerID, "containerd://"); !w.newestLive(id) {
					return fmt.Errorf("the kubelet reports %.12s running, not the newest live instance in containerd", id)
				}
				return nil
			})
			w.oneMoreSample(t)
			cancel()
			killed := strings.Count(readFrom(kubeletLog, logBefore), "Container main failed liveness probe")
			w.mu.Lock()
			defer w.mu.Unlock()
			ids := make([]string, 0, len(w.attempts))
			var attempts []int
			for id, a := range w.attempts {
				ids = append(ids, id)
				attempts = append(attempts, int(a))
			}
			sort.Ints(attempts)
			var gaps []float64
			for _, g := range stampGaps(t, name, restarts) {
				gaps = append(gaps, math.Round(g*100)/100)
			}
			t.Logf("kubelet liveness kills: %d; most live instances of main at once in containerd: %d %v; attempts %v; gaps %v s",
				killed, w.maxLive, w.atMax, attempts, gaps)
			if tc.name == "tcp" && killed == 0 {
				t.Errorf("the kubelet never acted on the failing liveness probe: the hold was not exercised")
			}
			if held := killsDuringHolds(t, readFrom(kubeletLog, logBefore), readFrom(shimLog, shimBefore), name); tc.name == "exec" && held != 0 {
				t.Errorf("the kubelet killed a held instance of main %d times on a failed exec probe; its prober discards an exec that errors on a dead container", held)
			}
			if w.maxLive > 1 {
				t.Errorf("containerd held %d live instances of main at once: %v", w.maxLive, w.atMax)
			}
			for i, a := range attempts {
				if a != i {
					t.Errorf("attempts of the instances created: %v, want 0, 1, 2, ... (one per restart)", attempts)
					break
				}
			}
			for i, want := range []float64{6, 12, 12} {
				if math.Abs(gaps[i]-want) > 1 {
					t.Errorf("exit-to-start gaps %v s, want 6, 12, 12 (the shim's curve) within 1 s", gaps)
					break
				}
			}
			p, err := kubeletPod(t, fullName(name))
			if err != nil {
				t.Fatal(err)
			}
			if s := statusOf(p, "main"); s == nil || s.RestartCount < restarts {
				t.Errorf("kubelet's status of main: %+v, want restartCount >= %d", s, restarts)
			}
		})
	}
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom returns path's content after offset.
// killsDuringHolds counts the kubelet's liveness kills of pod's main (its
// log, kubeletLog) that came while the shim held a restart of it (its log,
// shimLog): after a restart rule matched and before the rule's delay ran
// out. A kill at the crash itself is the probe racing the exit, not the
// hold: an exec probe that started as the process died is killed with it and
// fails (exit 137) rather than erroring, so the kubelet acts on it; it is
// logged, not counted.
func killsDuringHolds(t *testing.T, kubeletLog, shimLog, pod string) int {
	t.Helper()
	type hold struct{ from, to time.Time }
	var holds []hold
	for _, l := range strings.Split(shimLog, "\n") {
		var e struct {
			Time  time.Time `json:"time"`
			Msg   string    `json:"msg"`
			Pod   string    `json:"pod"`
			Delay int64     `json:"delay"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "podstate: restart rule matched" && strings.Contains(e.Pod, pod) {
			holds = append(holds, hold{e.Time, e.Time.Add(time.Duration(e.Delay))})
		}
	}
	n := 0
	for _, l := range strings.Split(kubeletLog, "\n") {
		if !strings.Contains(l, "Container main failed liveness probe") || !strings.Contains(l, pod) {
			continue
		}
		// klog: "I1129 21:49:38.895331 ..." (month, day, local time; no year).
		f := strings.Fields(l)
		if len(f) < 2 || len(f[0]) != 5 {
			t.Fatalf("kubelet log line without a klog header: %q", l)
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", f[0][1:]+" "+f[1], time.Local)
		if err != nil {
			t.Fatalf("kubelet log time: %v in %q", err, l)
		}
		at = at.AddDate(time.Now().Year(), 0, 0)
		during := slices.ContainsFunc(holds, func(h hold) bool { return !at.Before(h.from) && at.Before(h.to) })
		t.Logf("liveness kill at %s: during a hold: %v", at.Format("15:04:05.000"), during)
		if during {
			n++
		}
	}
	return n
}

func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// grepN returns the first n lines of s that contain must (if not "") and,
// when subs are given, one of them.
func grepN(s string, n int, must string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if len(out) == n {
			break
		}
		if must != "" && !strings.Contains(l, must) {
			continue
		}
		if len(subs) == 0 || slices.ContainsFunc(subs, func(sub string) bool { return strings.Contains(l, sub) }) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A pod deleted while its container's restart is held, after a liveness
// probe made the kubelet kill the held instance and create another one:
// the deletion is not stalled for the rest of the delay. (The kubelet's
// create used to wait in the shim until the restart was done, and the
// kubelet's pod worker with it: with a 60 s delay the pod's teardown began
// about a minute late.)
func TestPodDeletedDuringHoldNotStalled(t *testing.T) {
	needKubelet(t)
	withShimConfig(t, "[backoff]\ninitial_delay = \"60s\"\nmax_delay = \"60s\"\n")
	name := fmt.Sprintf("probe-hold-delete-%d", time.Now().Unix()%100000)
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(node.env["NODE_DATA"], "bench", name)) })
	kubeletLog, shimLog := filepath.Join(node.env["NODE_RUN"], "kubelet.log"), filepath.Join(node.env["NODE_RUN"], "cri-shim.log")
	before, shimBefore := fileSize(kubeletLog), fileSize(shimLog)
	placeManifest(t, name, probePod(name, "      tcpSocket: {port: 8080}"))
	eventually(t, 60*time.Second, "the kubelet to act on the failed liveness probe", func() error {
		if !strings.Contains(readFrom(kubeletLog, before), "Container main failed liveness probe") {
			return fmt.Errorf("no liveness kill in the kubelet's log yet")
		}
		return nil
	})
	// The kubelet's sync that killed the held instance creates the next
	// one: the pod is deleted once that create has reached the shim and
	// been answered (refused: the restart in progress creates it). The code
	// that made the create wait for the restart never answers it here.
	eventually(t, 20*time.Second, "the shim answering the kubelet's create of main during the hold", func() error {
		for _, l := range strings.Split(readFrom(shimLog, shimBefore), "\n") {
			if strings.Contains(l, "refusing the kubelet's create of a container the restart in progress creates itself") && strings.Contains(l, name) {
				return nil
			}
		}
		return fmt.Errorf("no refusal of the create in the shim's log: the create waits in the shim")
	})
	if err := os.Remove(filepath.Join(node.env["MANIFESTS"], name+".yaml")); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	rt := runtimeClient(t, node.env["CONTAINERD_SOCK"])
	eventually(t, 90*time.Second, "the pod's sandbox to stop", func() error {
		resp, err := rt.ListPodSandbox(ctxT(t, 10*time.Second), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
			State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
			LabelSelector: map[string]string{"io.kubernetes.pod.name": fullName(name)}}})
		if err != nil {
			return err
		}
		if len(resp.Items) > 0 {
			return fmt.Errorf("sandbox %s still ready", resp.Items[0].Id)
		}
		return nil
	})
	took := time.Since(deleted)
	t.Logf("pod deleted once the shim refused the kubelet's create after its liveness kill; its sandbox stopped %s later", took.Round(100*time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("the pod's teardown took %s: stalled behind the held restart (60 s delay)", took.Round(time.Second))
	}
}
