package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/podstatus"
)

// apiShim restarts the shim connected to the API server as the node (the
// kubelet's kubeconfig), with a backoff of 3 s doubling to 6 s so that a
// hold is long enough to see; the standalone shim is back after the test.
func apiShim(t *testing.T) {
	t.Helper()
	withShimConfig(t, fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n[backoff]\ninitial_delay = \"3s\"\nmax_delay = \"6s\"\n",
		node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"]))
}

// restartingPod restarts all its containers in place when main exits 3.
// main waits for /data/go (made by the test with exec), then its first
// `crashes` runs exit 3 after 5 s (time for the pod to be seen Ready between restarts); the next run keeps running. The count
// lives in an emptyDir, which an in-place restart keeps.
func restartingPod(name string, crashes int) *corev1.Pod {
	script := fmt.Sprintf(`n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n
if [ $n -le %d ]; then while [ ! -e /data/go ]; do sleep 0.2; done; sleep 5; exit 3; fi
exec sleep 3600`, crashes)
	p := apiPod(name, map[string]string{
		"restart-rules.cri-shim.io/main": `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[3]}}]`,
	}, "sh", "-c", script)
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	return p
}

// podConditions is the state of the conditions the test follows.
type podConditions struct{ ready, gate, restarting corev1.ConditionStatus }

func (c podConditions) String() string {
	return fmt.Sprintf("Ready=%s gate=%s AllContainersRestarting=%s", c.ready, c.gate, c.restarting)
}

func conditionsOf(p *corev1.Pod) podConditions {
	var c podConditions
	for _, x := range p.Status.Conditions {
		switch x.Type {
		case corev1.PodReady:
			c.ready = x.Status
		case podstatus.ReadyCondition:
			c.gate = x.Status
		case corev1.AllContainersRestarting:
			c.restarting = x.Status
		}
	}
	return c
}

// watchConditions records every distinct state of the pod's conditions as
// the API server reports them, until the test ends.
func watchConditions(t *testing.T, cs kubernetes.Interface, ns, name string) func() []podConditions {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []podConditions
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			c := conditionsOf(p)
			mu.Lock()
			if len(seen) == 0 || seen[len(seen)-1] != c {
				seen = append(seen, c)
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return func() []podConditions {
		mu.Lock()
		defer mu.Unlock()
		return append([]podConditions(nil), seen...)
	}
}

// execGo makes /data/go in the pod's running main container, through the shim.
func execGo(t *testing.T, p *corev1.Pod) {
	t.Helper()
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	mustCrictl(t, node.env["SHIM_SOCK"], "exec", id, "touch", "/data/go")
}

// shimEvents are the events.k8s.io events the shim wrote about the pod, by
// reason, each counted with its series.
func shimEvents(t *testing.T, cs kubernetes.Interface, ns, pod string) (map[string]int, []eventsv1.Event) {
	t.Helper()
	l, err := cs.EventsV1().Events(ns).List(ctxT(t, 10*time.Second), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	var mine []eventsv1.Event
	for _, e := range l.Items {
		if e.ReportingController != "cri-shim" || e.Regarding.Name != pod {
			continue
		}
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		counts[e.Reason] += n
		mine = append(mine, e)
	}
	return counts, mine
}

func restartsOf(p *corev1.Pod) int32 {
	if len(p.Status.ContainerStatuses) == 0 {
		return 0
	}
	return p.Status.ContainerStatuses[0].RestartCount
}

// restartConditionByShim is the AllContainersRestarting the shim writes
// during an in-place restart and after it: True then False when the kubelet
// does not own the condition; nothing when it does (its
// RestartAllContainersOnContainerExits gate is on, the default in v1.36 and
// v1.37: it declares the feature on its node, internal/podstatus/owner.go).
func restartConditionByShim(t testing.TB, cs kubernetes.Interface) (during, after corev1.ConditionStatus) {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(ctxT(t, 10*time.Second), node.env["NODE_NAME"], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(n.Status.DeclaredFeatures, podstatus.KubeletFeatureRestartAll) {
		t.Logf("the kubelet owns AllContainersRestarting (its %s gate is on): the shim writes only its readiness gate", podstatus.KubeletFeatureRestartAll)
		return "", ""
	}
	return corev1.ConditionTrue, corev1.ConditionFalse
}

// An in-place restart as kubectl sees it: the pod goes not Ready (its
// readiness gate False) while main's exit is held by the backoff and the
// pod restarted, and Ready again once the restarted containers run; the
// restarts, holds and their ends are events. AllContainersRestarting is
// the kubelet's where it declares RestartAllContainersOnContainerExits
// (its gate on, the default from v1.36: kubernetes v1.36.3
// pkg/features/kube_features.go): the shim must not write it there. With
// the gate off the shim writes it, True during the restart and False after.
func TestPodStatusDuringInPlaceRestart(t *testing.T) {
	cs := needAPIServer(t)
	defaultOn := version.MustParseGeneric(node.env["KUBELET_VERSION"]).AtLeast(version.MajorMinor(1, 36))
	t.Run("kubelet-api", func(t *testing.T) { inPlaceRestartStatus(t, cs, "kubelet-api", defaultOn, 2) })
	// One restart is enough to see the shim's condition come and go; the
	// backoff curve and the events are the same with either kubelet.
	t.Run("kubelet-api-nogate", func(t *testing.T) { inPlaceRestartStatus(t, cs, "kubelet-api-nogate", false, 1) })
}

// inPlaceRestartStatus runs restartingPod with crashes in-place restarts
// under the API-registered kubelet component (up.sh --start) and checks the
// pod's conditions and the shim's events; kubeletOwns is whether that
// kubelet declares RestartAllContainersOnContainerExits.
func inPlaceRestartStatus(t *testing.T, cs kubernetes.Interface, component string, kubeletOwns bool, crashes int) {
	statusStack(t, cs, component, kubeletOwns)
	ns := testNamespace(t, cs, "e2e-status")
	enableGate(t, cs, ns)
	seen := watchConditions(t, cs, ns, "restarting")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), restartingPod("restarting", crashes), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, cs, ns, "restarting", 2*time.Minute, "pod Ready with its gate True", func(p *corev1.Pod) error {
		if c := conditionsOf(p); c.gate != corev1.ConditionTrue {
			return fmt.Errorf("%v", c)
		}
		return podReady(p)
	})
	execGo(t, p)
	// The shim's AllContainersRestarting: none where the kubelet owns it
	// (and the kubelet writes none for a pod without native restart rules:
	// kubernetes v1.37.2 pkg/kubelet/kubelet_pods.go, generateAPIPodStatus,
	// podutil.AllContainersCouldRestart).
	during, after := corev1.ConditionTrue, corev1.ConditionFalse
	if kubeletOwns {
		during, after = "", ""
	}
	waitPod(t, cs, ns, "restarting", 2*time.Minute, fmt.Sprintf("%d in-place restarts over, pod Ready", crashes), func(p *corev1.Pod) error {
		c := conditionsOf(p)
		if restartsOf(p) < int32(crashes) || c != (podConditions{corev1.ConditionTrue, corev1.ConditionTrue, after}) {
			return fmt.Errorf("restarts %d, %v", restartsOf(p), c)
		}
		return nil
	})
	// The states in order: Ready before the exit; then for each restart not
	// Ready with the gate False (and AllContainersRestarting True where the
	// shim writes it) during the hold; Ready again.
	states := seen()
	t.Logf("condition states seen: %v", states)
	want := []podConditions{{corev1.ConditionTrue, corev1.ConditionTrue, ""}}
	for range crashes {
		want = append(want, podConditions{corev1.ConditionFalse, corev1.ConditionFalse, during},
			podConditions{corev1.ConditionTrue, corev1.ConditionTrue, after})
	}
	i := 0
	for _, s := range states {
		if i < len(want) && s == want[i] {
			i++
		}
		if kubeletOwns && s.restarting != "" {
			t.Errorf("AllContainersRestarting %s written while the kubelet owns it (state %v)", s.restarting, s)
		}
	}
	if i < len(want) {
		t.Fatalf("condition states %v lack %v (in this order)", states, want[i:])
	}
	counts, evs := shimEvents(t, cs, ns, "restarting")
	for _, e := range evs {
		t.Logf("event %s %s (%s): %s", e.Type, e.Reason, e.Action, e.Note)
	}
	if counts["RestartAllContainersInPlace"] != crashes || counts["BackOff"] != crashes || counts["RestartedInPlace"] != crashes {
		t.Fatalf("events by reason %v, want %d RestartAllContainersInPlace, BackOff and RestartedInPlace", counts, crashes)
	}
	// Each hold with its delay: the curve's 3 s, then 6 s.
	var holds []string
	for _, e := range evs {
		if e.Reason == "BackOff" {
			holds = append(holds, e.Action+": "+e.Note)
		}
	}
	slices.Sort(holds)
	if want := []string{
		"Hold 3s (main exited 3): Back-off 3s restarting failed container main (exit code 3)",
		"Hold 6s (main exited 3): Back-off 6s restarting failed container main (exit code 3)",
	}[:crashes]; !slices.Equal(holds, want) {
		t.Fatalf("hold events %q, want %q", holds, want)
	}
}

// statusStack runs, for the rest of the test, the API-registered kubelet
// component (up.sh --start), waits until the node declares
// RestartAllContainersOnContainerExits exactly when kubeletOwns (the
// kubelet rewrites its node's declared features when it runs: kubernetes
// v1.37.2 pkg/kubelet/kubelet_node_status.go, setNodeStatus), and only then
// restarts the shim connected to the API (apiShim): the shim reads them
// when it starts to know whether it may write AllContainersRestarting
// (internal/podstatus/owner.go). The node's declared features are put back
// as they were once the kubelet is stopped, so that a later test's shim
// does not read this kubelet's.
func statusStack(t *testing.T, cs kubernetes.Interface, component string, kubeletOwns bool) {
	t.Helper()
	keepDeclaredFeatures(t, cs)
	apiKubeletAs(t, cs, component)
	eventually(t, time.Minute, fmt.Sprintf("the node declaring %s: %v", podstatus.KubeletFeatureRestartAll, kubeletOwns), func() error {
		n, err := cs.CoreV1().Nodes().Get(ctxT(t, 10*time.Second), node.env["NODE_NAME"], metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.Contains(n.Status.DeclaredFeatures, podstatus.KubeletFeatureRestartAll) != kubeletOwns {
			return fmt.Errorf("declared features %v", n.Status.DeclaredFeatures)
		}
		return nil
	})
	apiShim(t)
}

// keepDeclaredFeatures puts the node's status.declaredFeatures back as they
// are now when the test ends (or removes the node if there is none yet).
// Register it before the kubelet starts, so it runs after the kubelet is
// stopped.
func keepDeclaredFeatures(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	name := node.env["NODE_NAME"]
	n, err := cs.CoreV1().Nodes().Get(ctxT(t, 10*time.Second), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		t.Cleanup(func() {
			if err := cs.CoreV1().Nodes().Delete(ctxT(t, 10*time.Second), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("removing node %s after the test: %v", name, err)
			}
		})
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"declaredFeatures": n.Status.DeclaredFeatures}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := cs.CoreV1().Nodes().Patch(ctxT(t, 10*time.Second), name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Errorf("putting node %s's declared features back: %v", name, err)
		}
	})
}

// An API server that is down does not stop restarts: the shim starts
// without it and restarts the pod in place meanwhile, and once the server
// is back the pod's status catches up and the events arrive.
func TestPodStatusCatchesUpAfterAPIServerOutage(t *testing.T) { apiOutage(t, false) }

// A shim restarted during the outage loses the writes its predecessor
// queued (the queue is in memory); the new process writes every tracked
// pod's conditions as they are once the server answers. The pod had no
// AllContainersRestarting before the outage: it appears (False) only
// through that catch-up.
func TestPodStatusCatchesUpAfterShimRestartDuringOutage(t *testing.T) { apiOutage(t, true) }

func apiOutage(t *testing.T, restartShimAfter bool) {
	cs := needAPIServer(t)
	apiShim(t)
	apiKubelet(t, cs)
	ns := testNamespace(t, cs, "e2e-outage")
	enableGate(t, cs, ns)
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), restartingPod("outage", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, cs, ns, "outage", 2*time.Minute, "pod Ready", podReady)
	uid := string(p.UID)

	keepRunning(t, "apiserver")
	killPidFile(t, "kube-apiserver", 15)
	// A shim started while the API server is down serves CRI all the same.
	killPidFile(t, "cri-shim", 15)
	if err := script("up.sh", "--start", "cri-shim"); err != nil {
		t.Fatal(err)
	}
	execGo(t, p)
	t.Cleanup(func() {
		if t.Failed() {
			out, err := crictl(t, node.env["CONTAINERD_SOCK"], "ps", "-a", "--label", "io.kubernetes.pod.uid="+uid)
			t.Logf("containers of the pod in containerd (%v):\n%s", err, out)
			for _, d := range []string{"cri-shim", "kubelet"} {
				log, err := os.ReadFile(filepath.Join(node.env["NODE_RUN"], d+".log"))
				t.Logf("%s log (%v):\n%s", d, err, lastLines(string(log), 30))
			}
		}
	})
	eventually(t, 90*time.Second, "two in-place restarts with the API server down", func() error {
		// The kubelet removes all but the newest exited instance, so the
		// running one's attempt counts the restarts.
		out, err := crictl(t, node.env["SHIM_SOCK"], "ps", "-o", "json", "--name", "^main$", "--label", "io.kubernetes.pod.uid="+uid)
		if err != nil {
			return err
		}
		var l struct {
			Containers []struct {
				Metadata struct{ Attempt int } `json:"metadata"`
			} `json:"containers"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return err
		}
		if len(l.Containers) != 1 || l.Containers[0].Metadata.Attempt < 2 {
			return fmt.Errorf("running main: %+v", l.Containers)
		}
		return nil
	})
	m := scrapeMetrics(t)
	if up, q := metricValue(m, "cri_shim_kubeapi_up"), metricValue(m, "cri_shim_kubeapi_queue_items"); up != 0 || q < 1 {
		t.Fatalf("with the API server down: cri_shim_kubeapi_up %v, queue %v; want 0 and writes waiting", up, q)
	}
	if restartShimAfter {
		killPidFile(t, "cri-shim", 15)
		if err := script("up.sh", "--start", "cri-shim"); err != nil {
			t.Fatal(err)
		}
	}

	if err := script("up.sh", "--start", "apiserver"); err != nil {
		t.Fatal(err)
	}
	_, after := restartConditionByShim(t, cs)
	waitPod(t, cs, ns, "outage", 2*time.Minute, "status caught up: Ready, gate True, AllContainersRestarting as the shim writes it", func(p *corev1.Pod) error {
		c := conditionsOf(p)
		if c != (podConditions{corev1.ConditionTrue, corev1.ConditionTrue, after}) {
			return fmt.Errorf("%v", c)
		}
		return nil
	})
	if restartShimAfter {
		return // the events went with the process that queued them
	}
	eventually(t, time.Minute, "the outage's events written", func() error {
		counts, _ := shimEvents(t, cs, ns, "outage")
		if counts["RestartAllContainersInPlace"] != 2 || counts["RestartedInPlace"] != 2 {
			return fmt.Errorf("events by reason %v", counts)
		}
		return nil
	})
	if up := metricValue(scrapeMetrics(t), "cri_shim_kubeapi_up"); up != 1 {
		t.Fatalf("cri_shim_kubeapi_up %v after the API server came back", up)
	}
}
