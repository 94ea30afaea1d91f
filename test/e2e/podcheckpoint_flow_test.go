package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	"github.com/cri-shim/cri-shim/internal/podspec"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// shimAsNode restarts the shim connected to the API server as the node (the
// kubelet's kubeconfig) and runs the API kubelet; both are undone after the test.
func shimAsNode(t *testing.T) (kubernetes.Interface, *podcheckpoint.Client) {
	t.Helper()
	cs := needAPIServer(t)
	withShimConfig(t, fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n", node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"]))
	apiKubelet(t, cs)
	return cs, podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
}

// secretAPIPod is secretPod's process as an API pod.
func secretAPIPod(name, restoreFrom string) *corev1.Pod {
	var ann map[string]string
	if restoreFrom != "" {
		ann = map[string]string{podspec.RestoreFromKey: restoreFrom}
	}
	return apiPod(name, ann, "sh", "-c", "S=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'); i=0; while true; do echo secret=$S n=$i; i=$((i+1)); sleep 0.1; done")
}

// nodeViewHasNoPodSpec reads ns/name with the node identity of kubeconfig
// (a kubelet's, system:node:<name>), as raw JSON: nothing of the source
// pod's spec is in it (marker is a string only the pod's spec holds), and
// its status has no checkpointedPodTemplate. Any node may read any
// PodCheckpoint (deploy/rbac), so what a node reads here every node reads.
func nodeViewHasNoPodSpec(t *testing.T, kubeconfig, ns, name, marker string) {
	t.Helper()
	cfg := restConfig(t, kubeconfig)
	nc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := nc.Discovery().RESTClient().Get().AbsPath("/apis", cpv1.SchemeGroupVersion.Group, cpv1.SchemeGroupVersion.Version,
		"namespaces", ns, cpv1.Resource, name).DoRaw(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatalf("GET %s/%s as %s: %v", ns, name, cfg.TLSClientConfig.CertFile, err)
	}
	var obj struct {
		Status map[string]json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Status == nil {
		t.Fatalf("GET %s/%s as the node: %v: %s", ns, name, err, raw)
	}
	if strings.Contains(string(raw), marker) || obj.Status["checkpointedPodTemplate"] != nil || obj.Status["podSpecDigest"] == nil {
		t.Errorf("the node's view of %s/%s carries the pod's spec (or no podSpecDigest): %s", ns, name, raw)
	}
	t.Logf("the node's view of %s/%s: %d bytes, status fields %v", ns, name, len(raw), slices.Sorted(maps.Keys(obj.Status)))
}

// reasonsOf records every Ready reason of ns/name a watch shows, in order.
func reasonsOf(t *testing.T, c *podcheckpoint.Client, ns, name string) func() []string {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.Watch(ctx, ns, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 100)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if pc, ok := ev.Object.(*cpv1.PodCheckpoint); ok {
				if c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionReady); c != nil {
					ch <- c.Reason
				}
			}
		}
	}()
	var seen []string
	return func() []string {
		for {
			select {
			case r := <-ch:
				if len(seen) == 0 || seen[len(seen)-1] != r {
					seen = append(seen, r)
				}
			default:
				return seen
			}
		}
	}
}

func waitCheckpoint(t *testing.T, c *podcheckpoint.Client, ns, name, reason string, timeout time.Duration) *cpv1.PodCheckpoint {
	t.Helper()
	var pc *cpv1.PodCheckpoint
	eventually(t, timeout, name+" "+reason, func() error {
		var err error
		if pc, err = c.Get(ctxT(t, 10*time.Second), ns, name); err != nil {
			return err
		}
		if r := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionReady); r == nil || r.Reason != reason {
			return fmt.Errorf("Ready %+v", r)
		}
		return nil
	})
	return pc
}

// eventOf waits for an event about ns/name (of any kind) that ok accepts
// and returns its message.
func eventOf(t *testing.T, cs kubernetes.Interface, ns, name, what string, ok func(corev1.Event) bool) string {
	t.Helper()
	var msg string
	eventually(t, 90*time.Second, name+": "+what, func() error {
		evs, err := cs.CoreV1().Events(ns).List(ctxT(t, 10*time.Second), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if ok(e) {
				msg = e.Message
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s", len(evs.Items), what)
	})
	return msg
}

// sandboxEvent waits for an event of pod ns/name whose message has want
// (the kubelet reports a failed RunPodSandbox so) and returns it.
func sandboxEvent(t *testing.T, cs kubernetes.Interface, ns, name, want string) string {
	t.Helper()
	return eventOf(t, cs, ns, name, "saying "+want, func(e corev1.Event) bool { return strings.Contains(e.Message, want) })
}

// reasonEvent waits for an event with reason about ns/name and returns its message.
func reasonEvent(t *testing.T, cs kubernetes.Interface, ns, name, reason string) string {
	t.Helper()
	return eventOf(t, cs, ns, name, "with reason "+reason, func(e corev1.Event) bool { return e.Reason == reason })
}

func stillPending(t *testing.T, cs kubernetes.Interface, ns, name, secret string) {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(ctxT(t, 10*time.Second), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("%s/%s is %s, want Pending", ns, name, p.Status.Phase)
	}
	if s, _, _ := secretLog(t, ns, name); s[secret] {
		t.Errorf("%s/%s runs the checkpointed process", ns, name)
	}
}

// Issue 16, acceptance 2, on the real single-node cluster: a PodCheckpoint
// goes Pending -> CheckpointInProgress -> CheckpointCompleted with its status
// filled; a pod naming it comes up Running with the source's memory, and its
// log from the kubelet (what kubectl logs shows) has its process counting on
// (issue 27); a pod whose spec differs stays Pending with PodSpecMismatch
// naming the field; an object pinned to another UID ends SourcePodReplaced; a
// pod of another namespace cannot name it; deleting the object removes the
// node's data.
func TestPodCheckpointCheckpointAndRestoreByName(t *testing.T) {
	cs, pcs := shimAsNode(t)
	ns := testNamespace(t, cs, "e2e-pcp")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("src", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src := waitPod(t, cs, ns, "src", 2*time.Minute, "source Ready", podReady)
	secret := loggedSecret(t, ns, "src", 20)

	reasons := reasonsOf(t, pcs, ns, "cp")
	if _, err := pcs.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "cp", "src", 120)); err != nil {
		t.Fatal(err)
	}
	pc := waitCheckpoint(t, pcs, ns, "cp", cpv1.ReasonCompleted, 2*time.Minute)
	var got []string
	eventually(t, 10*time.Second, "the watch delivering CheckpointCompleted", func() error {
		if got = reasons(); !slices.Contains(got, cpv1.ReasonCompleted) {
			return fmt.Errorf("reasons seen %v", got)
		}
		return nil
	})
	if i, j, k := slices.Index(got, cpv1.ReasonPending), slices.Index(got, cpv1.ReasonInProgress), slices.Index(got, cpv1.ReasonCompleted); i < 0 || j < i || k < j {
		t.Errorf("Ready reasons seen %v, want Pending, CheckpointInProgress, CheckpointCompleted in order", got)
	}
	s := pc.Status
	if s.NodeName != node.env["NODE_NAME"] || s.SourcePodUID == nil || *s.SourcePodUID != src.UID {
		t.Errorf("status node %q, source UID %v (pod %s)", s.NodeName, s.SourcePodUID, src.UID)
	}
	if s.CheckpointLocation == nil || s.CheckpointLocation.NodeLocal == nil || s.CompletionTime == nil || s.SizeBytes <= 0 ||
		len(s.CheckpointedContainers) != 1 || s.CheckpointedContainers[0].Name != "main" {
		t.Fatalf("status %+v", s)
	}
	data := filepath.Join(node.env["CHECKPOINTS"], s.CheckpointLocation.NodeLocal.Path)
	if _, err := layout.ReadManifest(data); err != nil {
		t.Errorf("checkpoint data: %v", err)
	}
	// The template stays in the data directory; the status names its
	// spec's digest, and the node's view of the object holds no pod spec.
	tf := filepath.Join(data, podcheckpoint.TemplateFile)
	if fi, err := os.Stat(tf); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("template file %s: %v, %v", tf, fi, err)
	}
	if !strings.HasPrefix(s.PodSpecDigest, "sha256:") || len(s.PodSpecDigest) != 71 {
		t.Errorf("status.podSpecDigest %q", s.PodSpecDigest)
	}
	if want, err := podcheckpoint.SpecDigest(podcheckpoint.Template(src)); err != nil || s.PodSpecDigest != want {
		t.Errorf("status.podSpecDigest %q, the source pod's %q (%v)", s.PodSpecDigest, want, err)
	}
	nodeViewHasNoPodSpec(t, node.env["KUBELET_KUBECONFIG"], ns, "cp", "/dev/urandom")
	t.Logf("checkpoint %s: %d bytes in %s, reasons %v", s.CheckpointLocation.NodeLocal.Path, s.SizeBytes, data, got)
	_, past, _ := secretLog(t, ns, "src") // beyond the checkpointed count
	reasonEvent(t, cs, ns, "cp", "CheckpointStarted")
	t.Logf("event CheckpointSucceeded: %s", reasonEvent(t, cs, ns, "cp", "CheckpointSucceeded"))

	// Restore by name.
	images := imagesSnapshot(t)
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("restored", "cp"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cs, ns, "restored", 2*time.Minute, "restored Running", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	eventually(t, 30*time.Second, "the restored pod logging the source's secret", func() error {
		if s, _, _ := secretLog(t, ns, "restored"); !s[secret] || len(s) != 1 {
			return fmt.Errorf("secrets %v, want only %s", s, secret)
		}
		return nil
	})
	podLogShowsSecret(t, ns, "restored", secret, past)
	assertNoImageChange(t, images, "the restore of "+ns+"/restored by the PodCheckpoint's name")

	// A spec that differs: PodSpecMismatch naming the field, Pending.
	mis := secretAPIPod("mismatch", "cp")
	mis.Spec.Containers[0].Command = []string{"sh", "-c", "sleep 3600"}
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), mis, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := sandboxEvent(t, cs, ns, "mismatch", "PodSpecMismatch")
	if !strings.Contains(msg, "spec.containers[0].command") {
		t.Errorf("PodSpecMismatch does not name the field: %s", msg)
	}
	if msg := reasonEvent(t, cs, ns, "mismatch", "PodSpecMismatch"); !strings.Contains(msg, "spec.containers[0].command") {
		t.Errorf("the shim's PodSpecMismatch event does not name the field: %s", msg)
	}
	stillPending(t, cs, ns, "mismatch", secret)

	// Another namespace cannot name it.
	other := testNamespace(t, cs, "e2e-pcp-other")
	if _, err := cs.CoreV1().Pods(other).Create(ctxT(t, 10*time.Second), secretAPIPod("thief", "cp"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sandboxEvent(t, cs, other, "thief", "no PodCheckpoint")
	stillPending(t, cs, other, "thief", secret)

	// Pinned to a UID that is not the live pod's: SourcePodReplaced.
	pinned := newPodCheckpoint(ns, "pinned", "src", 0)
	bogus := types.UID("00000000-0000-0000-0000-000000000000")
	pinned.Spec.SourcePodUID = &bogus
	if _, err := pcs.Create(ctxT(t, 10*time.Second), pinned); err != nil {
		t.Fatal(err)
	}
	pp := waitCheckpoint(t, pcs, ns, "pinned", cpv1.ReasonSourcePodReplaced, time.Minute)
	reasonEvent(t, cs, ns, "pinned", cpv1.ReasonSourcePodReplaced)
	if pp.Status.SourcePodUID == nil || *pp.Status.SourcePodUID != src.UID {
		t.Errorf("SourcePodReplaced status UID %v, want the live %s", pp.Status.SourcePodUID, src.UID)
	}

	assertNoImageChange(t, images, "the refused restores of "+ns+"/mismatch and "+other+"/thief")

	// Deleting the object removes the node's data (the finalizer).
	for _, p := range []string{"restored", "mismatch"} {
		_ = cs.CoreV1().Pods(ns).Delete(ctxT(t, 10*time.Second), p, metav1.DeleteOptions{})
	}
	if err := pcs.Delete(ctxT(t, 10*time.Second), ns, "cp"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the object and its data gone", func() error {
		if _, err := pcs.Get(ctxT(t, 10*time.Second), ns, "cp"); err == nil {
			return fmt.Errorf("object still there")
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			return fmt.Errorf("data still there: %v", err)
		}
		return nil
	})
}

// Issue 16, acceptance 3: kill -9 of the shim while it checkpoints for a
// PodCheckpoint: the restarted shim ends the object CheckpointFailed, no
// data of it is left, and the pod runs on, unpaused.
func TestPodCheckpointShimKilledMidCheckpoint(t *testing.T) {
	cs, pcs := shimAsNode(t)
	ns := testNamespace(t, cs, "e2e-pcp-kill")
	big := apiPod("big", nil, "sh", "-c", "x=$(head -c 314572800 /dev/zero | tr '\\0' a); echo ready; i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cs, ns, "big", 3*time.Minute, "big Ready", podReady)
	eventually(t, 2*time.Minute, "big holding its memory", func() error {
		files, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", ns+"_big_*", "main", "*.log"))
		for _, f := range files {
			if b, _ := os.ReadFile(f); strings.Contains(string(b), "ready") {
				return nil
			}
		}
		return fmt.Errorf("not ready")
	})
	pc, err := pcs.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "cp", "big", 300))
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(node.env["CHECKPOINTS"], podcheckpoint.DataDir(pc))
	// Mid-capture: the object in progress and criu's incomplete mark written.
	eventually(t, 2*time.Minute, "the capture under way", func() error {
		if _, err := os.Stat(filepath.Join(data, ".cri-shim-incomplete")); err != nil {
			return err
		}
		return nil
	})
	killPidFile(t, "cri-shim", syscall.SIGKILL)
	t.Log("shim killed during the capture")
	if err := script("up.sh", "--start", "cri-shim"); err != nil {
		t.Fatal(err)
	}
	got := waitCheckpoint(t, pcs, ns, "cp", cpv1.ReasonFailed, 2*time.Minute)
	t.Logf("after the restart: %s", meta.FindStatusCondition(got.Status.Conditions, cpv1.ConditionReady).Message)
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(data)
		t.Errorf("data of the failed checkpoint left: %v (%d entries)", err, len(entries))
	}
	p := waitPod(t, cs, ns, "big", time.Minute, "big Running and Ready", podReady)
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	eventually(t, 30*time.Second, "big's container running, not paused", func() error {
		if st := taskStates(t)[id]; st != "RUNNING" {
			return fmt.Errorf("container %s is %q in containerd", id, st)
		}
		return nil
	})
}
