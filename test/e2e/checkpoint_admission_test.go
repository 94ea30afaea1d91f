package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// taskEvent is one of containerd's task events as `ctr events` prints it.
type taskEvent struct {
	at        time.Time
	topic     string // /tasks/paused, /tasks/resumed
	container string
}

// watchTaskEvents records containerd's pause and resume events until stop,
// which returns them: what the shim did to the containers during a call,
// whatever it answered.
func watchTaskEvents(t *testing.T) (stop func() []taskEvent) {
	t.Helper()
	cmd := exec.Command(bin("ctr"), "--address", node.env["CONTAINERD_SOCK"], "events")
	var out bytes.Buffer
	var mu sync.Mutex
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	// ctr subscribes once it runs: a pause before that would be missed.
	time.Sleep(500 * time.Millisecond)
	return func() []taskEvent {
		time.Sleep(500 * time.Millisecond) // events still on their way
		cmd.Process.Kill()
		cmd.Wait()
		<-done
		mu.Lock()
		defer mu.Unlock()
		var evs []taskEvent
		for _, l := range strings.Split(out.String(), "\n") {
			f := strings.Fields(l)
			// 2026-11-29 14:00:00.123456789 +0000 UTC k8s.io /tasks/paused {"container_id":"..."}
			if len(f) < 7 || (f[5] != "/tasks/paused" && f[5] != "/tasks/resumed") {
				continue
			}
			at, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", strings.Join(f[:4], " "))
			if err != nil {
				t.Fatalf("ctr events line %q: %v", l, err)
			}
			id := strings.Trim(strings.TrimPrefix(strings.Join(f[6:], " "), `{"container_id":`), `"}`)
			evs = append(evs, taskEvent{at: at, topic: f[5], container: id})
		}
		return evs
	}
}

// pausesOf are the pause events of the containers ids.
func pausesOf(evs []taskEvent, ids map[string]string) []taskEvent {
	var out []taskEvent
	for _, e := range evs {
		for _, id := range ids {
			if e.container == id && e.topic == "/tasks/paused" {
				out = append(out, e)
			}
		}
	}
	return out
}

// Issue 44's "a namespace over its share gets no pod frozen", on the real
// stack: a namespace whose named checkpoint leaves less of its share than
// the pod's estimate (its containers' memory and writable layers) has its
// CheckpointPod refused, ResourceExhausted, and containerd never paused its
// containers (its event stream, watched during the call, has no pause of
// them, where the checkpoint before, within the share, had one each),
// nothing written.
func TestCheckpointAdmissionNamespaceOverShare(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	restart, orig := shimConfigSwitch(t)
	restart(checkpointLines(orig, "max_bytes_per_namespace = 1073741824\n"))
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	sb, ids, logs := counterPod(t, rt, "adm-share", "a", "b")
	eventually(t, 30*time.Second, "the counters running", func() error {
		if lastCounter(t, logs+"/a.log") < 5 || lastCounter(t, logs+"/b.log") < 5 {
			return fmt.Errorf("not counting yet")
		}
		return nil
	})

	// Within the share: a named checkpoint, paused once per container (the
	// watch sees pauses).
	named := newCheckpointDir(t, "e2e-adm-named")
	stop := watchTaskEvents(t)
	if _, err := rt.CheckpointPod(ctxT(t, time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: named,
		ContainerIds: []string{ids["a"], ids["b"]}}); err != nil {
		t.Fatal(err)
	}
	if p := pausesOf(stop(), ids); len(p) != 2 {
		t.Fatalf("the checkpoint within the share: %d pause events of its containers, want 2: %v", len(p), p)
	}
	m, err := layout.ReadManifest(named)
	if err != nil {
		t.Fatal(err)
	}

	// The share lowered to the named checkpoint's size and half a MiB: the
	// next is estimated at more than a MiB (a MiB per container besides its
	// memory) and refused.
	restart(checkpointLines(orig, fmt.Sprintf("max_bytes_per_namespace = %d\n", m.SizeBytes+512<<10)))
	rt = runtimeClient(t, node.env["SHIM_SOCK"])
	before := scrapeMetrics(t)
	over := newCheckpointDir(t, "e2e-adm-over")
	stop = watchTaskEvents(t)
	_, err = rt.CheckpointPod(ctxT(t, time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: over,
		ContainerIds: []string{ids["a"], ids["b"]}})
	evs := stop()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "namespace e2e holds") ||
		!strings.Contains(err.Error(), "checkpoint.max_bytes_per_namespace") || !strings.Contains(err.Error(), "nothing was paused") {
		t.Fatalf("CheckpointPod over the namespace's share: %v", err)
	}
	if p := pausesOf(evs, ids); len(p) > 0 {
		t.Fatalf("containerd paused the pod's containers for a refused checkpoint: %v", p)
	}
	assertRunning(t, ids)
	if ents, _ := os.ReadDir(over); len(ents) > 0 {
		t.Fatalf("the refused checkpoint wrote %d entries", len(ents))
	}
	after := scrapeMetrics(t)
	refused := `cri_shim_checkpoint_admission_refused_total{reason="max_bytes_per_namespace"}`
	if metricValue(after, refused) != 1 || metricValue(before, refused) > 0 {
		t.Errorf("%s went from %v to %v, want 1 (the shim restarted before)", refused, metricValue(before, refused), metricValue(after, refused))
	}
	frozen := "cri_shim_pod_checkpoint_frozen_seconds_count"
	if metricValue(after, frozen) != metricValue(before, frozen) {
		t.Errorf("%s went from %v to %v for a refused checkpoint", frozen, metricValue(before, frozen), metricValue(after, frozen))
	}
	t.Logf("refused before the pause: %v", err)
}

// The same through the API: a PodCheckpoint of a pod whose namespace's
// share is smaller than the pod's estimate ends CheckpointFailed, the
// message naming the share, and containerd never paused the pod's
// containers while the object was handled.
func TestPodCheckpointOverShareNoPodFrozen(t *testing.T) {
	cs := needAPIServer(t)
	withShimConfig(t, fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n", node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"]))
	withShimConfigEdit(t, func(b []byte) []byte { return checkpointLines(b, "max_bytes_per_namespace = 1048576\n") })
	apiKubelet(t, cs)
	pcs := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
	ns := testNamespace(t, cs, "e2e-over")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("src", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningSecret(t, cs, ns, "src", 3*time.Minute)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	l, err := rt.ListContainers(ctxT(t, 10*time.Second), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}, LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns}}})
	if err != nil || len(l.GetContainers()) == 0 {
		t.Fatalf("the pod's running containers: %v, %v", l, err)
	}
	ids := map[string]string{}
	for _, c := range l.GetContainers() {
		ids[c.GetMetadata().GetName()] = c.GetId()
	}
	stop := watchTaskEvents(t)
	if _, err := pcs.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "cp", "src", 120)); err != nil {
		t.Fatal(err)
	}
	pc := waitCheckpoint(t, pcs, ns, "cp", cpv1.ReasonFailed, 2*time.Minute)
	evs := stop()
	msg := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionReady).Message
	if !strings.Contains(msg, "namespace "+ns+" holds") || !strings.Contains(msg, "checkpoint.max_bytes_per_namespace") || !strings.Contains(msg, "nothing was paused") {
		t.Fatalf("CheckpointFailed for another reason: %s", msg)
	}
	if p := pausesOf(evs, ids); len(p) > 0 {
		t.Fatalf("containerd paused the pod's containers: %v", p)
	}
	assertRunning(t, ids)
	t.Logf("%d containers never paused; Ready: %s", len(ids), msg)
}

// With max_concurrent_captures = 1, two CheckpointPods at once: the second
// waits for the first and succeeds, its pause after every resume of the
// first (containerd's events); a third whose deadline comes before the
// first ends is refused, ResourceExhausted, its pod never paused.
func TestCheckpointAdmissionConcurrencyLimit(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	restart, orig := shimConfigSwitch(t)
	restart(checkpointLines(orig, "max_concurrent_captures = 1\n"))
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	// 256 MiB of random bytes in the writable layer: the first call holds
	// its slot for the seconds its rootfs diff takes to compress and write.
	blob := counterCfg("big")
	blob.Command = []string{"sh", "-c", "dd if=/dev/urandom of=/tmp/blob bs=1048576 count=256 2>/dev/null; " + counterCmd[2]}
	sb1, first, firstLogs := startPod(t, rt, "adm-first", blob)
	sb2, second, _ := counterPod(t, rt, "adm-second", "a")
	sb3, third, _ := counterPod(t, rt, "adm-third", "a")
	eventually(t, time.Minute, "the blob written", func() error {
		if lastCounter(t, firstLogs+"/big.log") < 1 {
			return fmt.Errorf("not counting yet")
		}
		return nil
	})
	req := func(sb, id, dir string) *runtimeapi.CheckpointPodRequest {
		return &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: newCheckpointDir(t, dir), ContainerIds: []string{id}}
	}
	r1, r2, r3 := req(sb1, first["big"], "e2e-adm-c1"), req(sb2, second["a"], "e2e-adm-c2"), req(sb3, third["a"], "e2e-adm-c3")
	stop := watchTaskEvents(t)
	errs := make(chan error, 2)
	go func() { _, err := rt.CheckpointPod(ctxT(t, 3*time.Minute), r1); errs <- err }()
	eventually(t, 30*time.Second, "the first call's pause", func() error {
		if st := taskStates(t)[first["big"]]; st != "PAUSED" {
			return fmt.Errorf("first pod's container is %s", st)
		}
		return nil
	})
	go func() { _, err := rt.CheckpointPod(ctxT(t, 3*time.Minute), r2); errs <- err }()
	// 1.5 s: it waits 1.2 s (the capture's margin kept) and gives up.
	_, err3 := rt.CheckpointPod(ctxT(t, 1500*time.Millisecond), r3)
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("a call with time to wait: %v", err)
		}
	}
	evs := stop()
	if status.Code(err3) != codes.ResourceExhausted || !strings.Contains(err3.Error(), "checkpoint.max_concurrent_captures") {
		t.Fatalf("a call whose deadline comes first: %v", err3)
	}
	if p := pausesOf(evs, third); len(p) > 0 {
		t.Fatalf("the refused call's pod was paused: %v", p)
	}
	var lastResume1, pause2 time.Time
	for _, e := range evs {
		if e.container == first["big"] && e.topic == "/tasks/resumed" && e.at.After(lastResume1) {
			lastResume1 = e.at
		}
		if e.container == second["a"] && e.topic == "/tasks/paused" && pause2.IsZero() {
			pause2 = e.at
		}
	}
	if lastResume1.IsZero() || pause2.IsZero() {
		t.Fatalf("events seen: the first's resume %v, the second's pause %v: %v", lastResume1, pause2, evs)
	}
	if !pause2.After(lastResume1) {
		t.Fatalf("the second pod paused at %s, before the first was resumed at %s: two captures at once", pause2.Format(time.StampMicro), lastResume1.Format(time.StampMicro))
	}
	for _, r := range []*runtimeapi.CheckpointPodRequest{r1, r2} {
		if _, err := layout.ReadManifest(r.OutputPath); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the second paused %s after the first resumed; the third: %v", pause2.Sub(lastResume1).Round(time.Millisecond), err3)
}

// checkpointLines is the shim's config b with lines added to its
// [checkpoint] section.
func checkpointLines(b []byte, lines string) []byte {
	return []byte(strings.Replace(string(b), "[checkpoint]\n", "[checkpoint]\n"+lines, 1))
}
