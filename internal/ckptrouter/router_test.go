package ckptrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fcache "k8s.io/client-go/tools/cache/testing"

	"github.com/cri-shim/cri-shim/internal/podspec"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// apiServer is the two watched collections and the routing write, as the
// API server applies Client.Route's merge patch: the write changes the
// object, and the change is sent on the object watch.
type apiServer struct {
	pods, objects *fcache.FakeControllerSource

	mu     sync.Mutex
	cur    map[string]*cpv1.PodCheckpoint
	writes []string // "ns/name=node"
	fail   int      // writes to refuse
}

func newAPIServer() *apiServer {
	return &apiServer{pods: fcache.NewFakeControllerSource(), objects: fcache.NewFakeControllerSource(), cur: map[string]*cpv1.PodCheckpoint{}}
}

func (a *apiServer) label(_ context.Context, ns, name, rv, node string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail > 0 {
		a.fail--
		return errors.New("the API server is down")
	}
	pc := a.cur[ns+"/"+name].DeepCopy()
	if pc.ResourceVersion != rv {
		return apierrors.NewConflict(cpv1.SchemeGroupVersion.WithResource(cpv1.Resource).GroupResource(), name, errors.New("the object has been modified"))
	}
	if pc.Labels == nil {
		pc.Labels = map[string]string{}
	}
	pc.Labels[cpv1.NodeLabel] = cpv1.NodeLabelValue(node)
	delete(pc.Annotations, cpv1.NodeNameAnnotation)
	if cpv1.NodeLabelValue(node) != node {
		pc.Annotations = map[string]string{cpv1.NodeNameAnnotation: node}
	}
	a.writes = append(a.writes, ns+"/"+name+"="+node)
	a.change(pc)
	return nil
}

// change stores pc as the current object (with the version the watch gives
// it) and sends it on the watch. a.mu held.
func (a *apiServer) change(pc *cpv1.PodCheckpoint) {
	a.objects.Modify(pc)
	a.cur[pc.Namespace+"/"+pc.Name] = pc.DeepCopy()
}

func (a *apiServer) create(pc *cpv1.PodCheckpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pc = pc.DeepCopy()
	a.objects.Add(pc)
	a.cur[pc.Namespace+"/"+pc.Name] = pc.DeepCopy()
}

// hold is a node writing its name into the object's status.
func (a *apiServer) hold(ns, name, node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pc := a.cur[ns+"/"+name].DeepCopy()
	pc.Status.NodeName = node
	a.change(pc)
}

func (a *apiServer) written() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.writes...)
}

func (a *apiServer) labelOf(ns, name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur[ns+"/"+name].Labels[cpv1.NodeLabel]
}

// routedTo says whether ns/name is routed to node (label and annotation).
func (a *apiServer) routedTo(ns, name, node string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	pc := a.cur[ns+"/"+name]
	return cpv1.RoutedTo(pc.Labels, pc.Annotations, node)
}

func pod(ns, name, uid, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node}}
}

func object(ns, name, podName string) *cpv1.PodCheckpoint {
	return &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: cpv1.PodCheckpointSpec{SourcePodName: podName}}
}

func start(t *testing.T, a *apiServer) {
	t.Helper()
	r := New(a.pods, a.objects, a.label, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle gives the router time to make writes it should not make.
func settle() { time.Sleep(200 * time.Millisecond) }

// Each object gets its own namespace's pod's node, also when pods of one
// name run in two namespaces on two nodes; an object whose pod is not bound
// yet is routed when it is; one already labelled right costs no write.
func TestRoutesEachObjectToItsPodsNode(t *testing.T) {
	a := newAPIServer()
	a.pods.Add(pod("a", "postgres-0", "u1", "node-1"))
	a.pods.Add(pod("b", "postgres-0", "u2", "node-2"))
	a.create(object("a", "cp", "postgres-0"))
	a.create(object("b", "cp", "postgres-0"))
	right := object("a", "labelled", "postgres-0")
	right.Labels = map[string]string{cpv1.NodeLabel: "node-1"}
	a.create(right)
	a.create(object("c", "early", "web-0"))
	start(t, a)

	eventually(t, "both postgres objects routed", func() bool { return a.labelOf("a", "cp") == "node-1" && a.labelOf("b", "cp") == "node-2" })
	settle()
	if a.labelOf("c", "early") != "" {
		t.Errorf("an object of a pod not bound yet got label %q", a.labelOf("c", "early"))
	}
	a.pods.Add(pod("c", "web-0", "u3", "node-3"))
	eventually(t, "the early object routed once its pod is bound", func() bool { return a.labelOf("c", "early") == "node-3" })
	settle()
	if w := a.written(); len(w) != 3 {
		t.Errorf("writes %v, want one per object that needed a label (3)", w)
	}
}

// A pod replaced on another node before any node held its object moves the
// object; once a node holds it, it stays with that node.
func TestFollowsThePodUntilANodeHoldsTheObject(t *testing.T) {
	a := newAPIServer()
	a.pods.Add(pod("a", "web-0", "u1", "node-1"))
	a.create(object("a", "cp", "web-0"))
	start(t, a)
	eventually(t, "routed to node-1", func() bool { return a.labelOf("a", "cp") == "node-1" })

	a.pods.Delete(pod("a", "web-0", "u1", "node-1"))
	a.pods.Add(pod("a", "web-0", "u2", "node-2"))
	eventually(t, "moved to node-2", func() bool { return a.labelOf("a", "cp") == "node-2" })

	a.hold("a", "cp", "node-2")
	a.pods.Delete(pod("a", "web-0", "u2", "node-2"))
	a.pods.Add(pod("a", "web-0", "u3", "node-3"))
	settle()
	if got := a.labelOf("a", "cp"); got != "node-2" {
		t.Errorf("a held object was moved to %q", got)
	}
}

// A refused write is retried with backoff until it is made.
func TestRetriesARefusedWrite(t *testing.T) {
	a := newAPIServer()
	a.fail = 2
	a.pods.Add(pod("a", "web-0", "u1", "node-1"))
	a.create(object("a", "cp", "web-0"))
	start(t, a)
	eventually(t, "routed after two refusals", func() bool { return a.labelOf("a", "cp") == "node-1" })
}

// A node name too long for a label value is routed by its hashed value,
// the one the node selects on.
func TestLongNodeName(t *testing.T) {
	a := newAPIServer()
	node := strings.Repeat("n", 70) + ".example"
	a.pods.Add(pod("a", "web-0", "u1", node))
	a.create(object("a", "cp", "web-0"))
	start(t, a)
	eventually(t, "routed", func() bool { return a.routedTo("a", "cp", node) })
	if v := a.labelOf("a", "cp"); len(v) > 63 {
		t.Error(fmt.Sprintf("label value %q is over 63 characters", v))
	}
}

// restorer is a pod of ns on node whose restore-from annotation names from.
func restorer(ns, name, uid, node, from string) *corev1.Pod {
	p := pod(ns, name, uid, node)
	p.Annotations = map[string]string{podspec.RestoreFromKey: from, "other": "dropped"}
	return p
}

func imageObject(ns, name string) *cpv1.PodCheckpoint {
	return &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cpv1.PodCheckpointSpec{SourceImage: "reg.example/ckpt@sha256:" + strings.Repeat("a", 64)}}
}

// An object with spec.sourceImage goes to the node of a bound pod of its
// namespace that restores from it (not one of another namespace, nor one
// naming another object); it follows such pods until a node holds it, and
// stays with the pod it is routed to while that pod is there.
func TestRoutesSourceImageObjectsToARestoringPodsNode(t *testing.T) {
	a := newAPIServer()
	a.create(imageObject("a", "img"))
	a.pods.Add(restorer("b", "thief", "u0", "node-0", "img"))
	a.pods.Add(restorer("a", "other", "u1", "node-1", "not-img"))
	start(t, a)
	settle()
	if got := a.labelOf("a", "img"); got != "" {
		t.Fatalf("routed to %q with no pod of its namespace restoring from it", got)
	}
	a.pods.Add(restorer("a", "r1", "u2", "node-3", "img"))
	eventually(t, "routed to the restoring pod's node", func() bool { return a.labelOf("a", "img") == "node-3" })
	a.pods.Add(restorer("a", "r2", "u3", "node-2", "img"))
	settle()
	if got := a.labelOf("a", "img"); got != "node-3" {
		t.Errorf("a second restoring pod moved the object to %q; it stays while its pod is there", got)
	}
	a.pods.Delete(restorer("a", "r1", "u2", "node-3", "img"))
	eventually(t, "moved to the remaining restoring pod's node", func() bool { return a.labelOf("a", "img") == "node-2" })
	a.hold("a", "img", "node-2")
	a.pods.Delete(restorer("a", "r2", "u3", "node-2", "img"))
	a.pods.Add(restorer("a", "r3", "u4", "node-4", "img"))
	settle()
	if got := a.labelOf("a", "img"); got != "node-2" {
		t.Errorf("a held object was moved to %q", got)
	}
	if w := a.written(); len(w) != 2 {
		t.Errorf("writes %v, want 2", w)
	}
}

// An object held with no label at all (an earlier release let the first
// restoring node take an object with spec.sourceImage) is labelled with its
// holder, its ticket; a held object with a label is never relabelled.
func TestLabelsAnUnlabelledHeldObjectWithItsHolder(t *testing.T) {
	a := newAPIServer()
	old := imageObject("a", "old")
	old.Status.NodeName = "node-1"
	a.create(old)
	other := object("a", "elsewhere", "web-0")
	other.Labels = map[string]string{cpv1.NodeLabel: "node-2"}
	other.Status.NodeName = "node-1"
	a.create(other)
	a.pods.Add(restorer("a", "r", "u1", "node-3", "old"))
	a.pods.Add(pod("a", "web-0", "u2", "node-3"))
	start(t, a)
	eventually(t, "labelled with its holder", func() bool { return a.labelOf("a", "old") == "node-1" })
	settle()
	if got := a.labelOf("a", "elsewhere"); got != "node-2" {
		t.Errorf("a held, labelled object relabelled %q", got)
	}
}

// The router's pod cache keeps a restore-from value only when it can name
// a PodCheckpoint: a pod's 256 KiB of annotation is not kept.
func TestSlimPodKeepsOnlyANameOfRestoreFrom(t *testing.T) {
	for v, keep := range map[string]bool{"cp-1": true, strings.Repeat("x", 300): false, "Not/A/Name": false} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p",
			Annotations: map[string]string{podspec.RestoreFromKey: v, "other": "x"}}}
		o, _ := slimPod(p)
		got := o.(*corev1.Pod).Annotations
		if _, kept := got[podspec.RestoreFromKey]; kept != keep || got["other"] != "" {
			t.Errorf("restore-from %.20q: kept %v, want %v (annotations %v)", v, kept, keep, got)
		}
	}
}
