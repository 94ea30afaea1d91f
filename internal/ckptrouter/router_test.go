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

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// apiServer is the two watched collections and the label write, as the API
// server applies a merge patch of labels: the write changes the object, and
// the change is sent on the object watch.
type apiServer struct {
	pods, objects *fcache.FakeControllerSource

	mu     sync.Mutex
	cur    map[string]*cpv1.PodCheckpoint
	writes []string // "ns/name=value"
	fail   int      // writes to refuse
}

func newAPIServer() *apiServer {
	return &apiServer{pods: fcache.NewFakeControllerSource(), objects: fcache.NewFakeControllerSource(), cur: map[string]*cpv1.PodCheckpoint{}}
}

func (a *apiServer) label(_ context.Context, ns, name, rv, value string) error {
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
	pc.Labels[cpv1.NodeLabel] = value
	a.writes = append(a.writes, ns+"/"+name+"="+value)
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
	eventually(t, "routed", func() bool { return a.labelOf("a", "cp") == cpv1.NodeLabelValue(node) })
	if v := a.labelOf("a", "cp"); len(v) > 63 {
		t.Error(fmt.Sprintf("label value %q is over 63 characters", v))
	}
}
