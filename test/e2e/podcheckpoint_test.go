package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// restConfig is the client config of kubeconfig.
func restConfig(t testing.TB, kubeconfig string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// podCheckpoints is a PodCheckpoint client with the credentials of kubeconfig.
func podCheckpoints(t testing.TB, kubeconfig string) *podcheckpoint.Client {
	t.Helper()
	c, err := podcheckpoint.NewClient(restConfig(t, kubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newPodCheckpoint(ns, name, pod string, timeout int32) *cpv1.PodCheckpoint {
	return &cpv1.PodCheckpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       cpv1.PodCheckpointSpec{SourcePodName: pod, TimeoutSeconds: &timeout},
	}
}

func wantInvalid(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: got %v, want Invalid saying %q", what, err, says)
	}
}

func wantForbidden(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: got %v, want a denial saying %q", what, err, says)
	}
}

// The CRD, RBAC and admission policies of deploy/ as the test stack applies
// them: a PodCheckpoint is accepted, only the router's identity (its user
// name and group) sets or changes its node label, invalid ones are refused
// by the schema, the spec (timeoutSeconds) is immutable, and a node's
// identity writes only objects routed to it (the label is its ticket) that
// no other node holds: a second node identity, with its own client
// certificate, is refused every write of an object routed to this node.
func TestPodCheckpointAPI(t *testing.T) {
	cs := needAPIServer(t)
	ns := testNamespace(t, cs, "e2e-pcp")
	admin := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
	nodeID := podCheckpoints(t, node.env["KUBELET_KUBECONFIG"])
	router := podCheckpoints(t, node.env["ROUTER_KUBECONFIG"])
	self := node.env["NODE_NAME"]
	const otherNode = "e2e-other-node"
	otherID := clientAs(t, "system:node:"+otherNode, "system:nodes")

	// The policies are loaded by the API server shortly after they are applied.
	var pc *cpv1.PodCheckpoint
	eventually(t, 30*time.Second, "a user's node label refused on create", func() error {
		forged := newPodCheckpoint(ns, "forged", "web-0", 30)
		forged.Labels = map[string]string{cpv1.NodeLabel: self}
		if _, err := admin.Create(ctxT(t, 10*time.Second), forged); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) ||
			!strings.Contains(err.Error(), "only the PodCheckpoint router") {
			_ = admin.Delete(ctxT(t, 10*time.Second), ns, "forged")
			return fmt.Errorf("user creates a labelled object: %v", err)
		}
		var err error
		_ = admin.Delete(ctxT(t, 10*time.Second), ns, "cp")
		if pc, err = admin.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "cp", "web-0", 30)); err != nil {
			return err
		}
		if err := router.Route(ctxT(t, 10*time.Second), ns, "cp", pc.ResourceVersion, self); err != nil {
			return fmt.Errorf("the router routes cp here: %v", err)
		}
		if pc, err = admin.Get(ctxT(t, 10*time.Second), ns, "cp"); err != nil {
			return err
		}
		// A node may not write a status naming another node.
		other := pc.DeepCopy()
		other.Status.NodeName = "other-node"
		_, err = nodeID.UpdateStatus(ctxT(t, 10*time.Second), other)
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "its own name") {
			return fmt.Errorf("node writes status.nodeName of another node: %v, want a denial saying %q", err, "its own name")
		}
		return nil
	})
	long := strings.Repeat("a", 70)
	if _, err := admin.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "long", long, 0)); err != nil {
		t.Fatal(err)
	}

	_, err := admin.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "no-pod", "", 0))
	wantInvalid(t, "no sourcePodName", err, "spec.sourcePodName")
	_, err = admin.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "bad-pod", "Web_0", 0))
	wantInvalid(t, "sourcePodName not a pod name", err, "spec.sourcePodName")
	_, err = admin.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "neg", "web-0", -1))
	wantInvalid(t, "negative timeoutSeconds", err, "spec.timeoutSeconds")

	upd := pc.DeepCopy()
	*upd.Spec.TimeoutSeconds = 60
	_, err = admin.Update(ctxT(t, 10*time.Second), upd)
	wantInvalid(t, "timeoutSeconds changed", err, "spec is immutable")

	// The second node: cp is routed to this node and held by none, and
	// the other node may write none of it, with its own credentials.
	theirs := pc.DeepCopy()
	theirs.Status.NodeName = otherNode
	_, err = otherID.UpdateStatus(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node takes an object routed here", err, "routed to node label "+self+", not to node "+otherNode)
	theirs = pc.DeepCopy()
	theirs.Labels[cpv1.NodeLabel] = otherNode
	_, err = otherID.Update(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node relabels an object routed here", err, "denied request")
	theirs = pc.DeepCopy()
	theirs.Annotations = map[string]string{"x": "y"}
	_, err = otherID.Update(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node annotates an object routed here", err, "routed to node label "+self)
	theirs = pc.DeepCopy()
	theirs.Finalizers = []string{cpv1.NodeDataFinalizer}
	_, err = otherID.Update(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node sets its finalizer on an object routed here", err, "routed to node label "+self)
	// A node may not patch at all (RBAC).
	err = otherID.SetLabel(ctxT(t, 10*time.Second), ns, "cp", pc.ResourceVersion, "app", "x")
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cannot patch") {
		t.Errorf("a node patches a PodCheckpoint: %v, want Forbidden by RBAC (cannot patch)", err)
	}

	// The node label: the router's identity sets it (a patch at the
	// object's version); a user may neither set nor remove it, nor may a
	// client with the router's user name but not its group.
	upd = pc.DeepCopy()
	upd.Labels = map[string]string{cpv1.NodeLabel: "other-node"}
	_, err = admin.Update(ctxT(t, 10*time.Second), upd)
	wantForbidden(t, "user sets the node label", err, "only the PodCheckpoint router")
	impostor := clientAs(t, "system:serviceaccount:cri-shim-system:cri-shim-router")
	err = impostor.SetLabel(ctxT(t, 10*time.Second), ns, "cp", pc.ResourceVersion, cpv1.NodeLabel, "other-node")
	wantForbidden(t, "the router's user name without its group sets the label", err, "router")
	if err := router.SetLabel(ctxT(t, 10*time.Second), ns, "cp", pc.ResourceVersion, cpv1.NodeLabel, "other-node"); err != nil {
		t.Fatalf("the router labels an object: %v", err)
	}
	if err := router.SetLabel(ctxT(t, 10*time.Second), ns, "cp", pc.ResourceVersion, cpv1.NodeLabel, self); !apierrors.IsConflict(err) {
		t.Errorf("the router labels from a stale version: %v, want Conflict", err)
	}
	if pc, err = admin.Get(ctxT(t, 10*time.Second), ns, "cp"); err != nil {
		t.Fatal(err)
	}
	upd = pc.DeepCopy()
	delete(upd.Labels, cpv1.NodeLabel)
	_, err = admin.Update(ctxT(t, 10*time.Second), upd)
	wantForbidden(t, "user removes the node label", err, "only the PodCheckpoint router")
	if _, err := router.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "by-router", "web-0", 0)); !apierrors.IsForbidden(err) {
		t.Errorf("the router creates a PodCheckpoint: %v, want Forbidden", err)
	}

	// A node may not create objects (RBAC) ...
	_, err = nodeID.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "by-node", "web-0", 0))
	if !apierrors.IsForbidden(err) {
		t.Errorf("node creates a PodCheckpoint: %v, want Forbidden", err)
	}
	// ... nor hold one routed to another node ...
	mine := pc.DeepCopy()
	mine.Status.NodeName = self
	mine.Status.Conditions = []metav1.Condition{{Type: cpv1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: cpv1.ReasonPending, Message: "e2e", LastTransitionTime: metav1.Now()}}
	_, err = nodeID.UpdateStatus(ctxT(t, 10*time.Second), mine)
	wantForbidden(t, "node holds an object routed to another node", err, "routed to node label other-node, not to node "+self)
	// ... but holds one routed to it by writing its own name, and may then
	// set its finalizer.
	if err := router.Route(ctxT(t, 10*time.Second), ns, "cp", pc.ResourceVersion, self); err != nil {
		t.Fatalf("the router routes cp back here: %v", err)
	}
	cur, err := nodeID.Get(ctxT(t, 10*time.Second), ns, "cp")
	if err != nil {
		t.Fatalf("node reads a PodCheckpoint: %v", err)
	}
	mine = cur.DeepCopy()
	mine.Status.NodeName = self
	mine.Status.Conditions = []metav1.Condition{{Type: cpv1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: cpv1.ReasonPending, Message: "e2e", LastTransitionTime: metav1.Now()}}
	held, err := nodeID.UpdateStatus(ctxT(t, 10*time.Second), mine)
	if err != nil {
		t.Fatalf("node writes the status of its object: %v", err)
	}
	held.Finalizers = []string{cpv1.NodeDataFinalizer}
	if held, err = nodeID.Update(ctxT(t, 10*time.Second), held); err != nil {
		t.Fatalf("node sets its finalizer: %v", err)
	}
	// Held here: the other node still writes nothing of it.
	theirs = held.DeepCopy()
	theirs.Status.NodeName = otherNode
	_, err = otherID.UpdateStatus(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node takes an object held here", err, "held by node "+self)
	theirs = held.DeepCopy()
	theirs.Status.SizeBytes = 1
	_, err = otherID.UpdateStatus(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node writes the status of an object held here", err, "held by node "+self)
	theirs = held.DeepCopy()
	theirs.Finalizers = nil
	_, err = otherID.Update(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "another node removes this node's finalizer", err, "held by node "+self)

	// The router changes only the node label, and only of an object no
	// node holds.
	err = router.SetLabel(ctxT(t, 10*time.Second), ns, "cp", held.ResourceVersion, cpv1.NodeLabel, "other-node-2")
	wantForbidden(t, "router moves a held object", err, "does not move an object")
	lp, err := admin.Get(ctxT(t, 10*time.Second), ns, "long")
	if err != nil {
		t.Fatal(err)
	}
	err = router.SetLabel(ctxT(t, 10*time.Second), ns, "long", lp.ResourceVersion, "app", "x")
	wantForbidden(t, "router sets another label", err, "changes only the label")
	// Of the object the node holds it changes its own finalizer only.
	for what, edit := range map[string]func(*cpv1.PodCheckpoint){
		"annotations":       func(pc *cpv1.PodCheckpoint) { pc.Annotations = map[string]string{"x": "y"} },
		"labels":            func(pc *cpv1.PodCheckpoint) { pc.Labels["app"] = "x" },
		"another finalizer": func(pc *cpv1.PodCheckpoint) { pc.Finalizers = append(pc.Finalizers, "example.com/keep") },
		"owner references": func(pc *cpv1.PodCheckpoint) {
			pc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"}}
		},
	} {
		relabel := held.DeepCopy()
		edit(relabel)
		_, err = nodeID.Update(ctxT(t, 10*time.Second), relabel)
		wantForbidden(t, "node changes "+what, err, "denied request")
	}
	held.Finalizers = nil
	if _, err = nodeID.Update(ctxT(t, 10*time.Second), held); err != nil {
		t.Fatalf("node removes its finalizer: %v", err)
	}

	// An object another node holds is not the node's to write.
	if err := router.Route(ctxT(t, 10*time.Second), ns, "long", lp.ResourceVersion, "other-node"); err != nil {
		t.Fatal(err)
	}
	theirs, err = admin.Get(ctxT(t, 10*time.Second), ns, "long")
	if err != nil {
		t.Fatal(err)
	}
	theirs.Status.NodeName = "other-node"
	if _, err = admin.UpdateStatus(ctxT(t, 10*time.Second), theirs); err != nil {
		t.Fatalf("admin writes status: %v", err)
	}
	theirs, err = nodeID.Get(ctxT(t, 10*time.Second), ns, "long")
	if err != nil {
		t.Fatal(err)
	}
	theirs.Status.NodeName = self
	_, err = nodeID.UpdateStatus(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "node takes over another node's object", err, "held by node other-node")
	theirs.Status.NodeName = "other-node"
	theirs.Status.SizeBytes = 1
	_, err = nodeID.UpdateStatus(ctxT(t, 10*time.Second), theirs)
	wantForbidden(t, "node writes another node's status", err, "held by node other-node")

	longNodeTicket(t, ns, admin, router)

	// The status schema confines the node-local path to one element.
	bad, _ := admin.Get(ctxT(t, 10*time.Second), ns, "long")
	bad.Status.CheckpointLocation = &cpv1.CheckpointSource{Type: cpv1.CheckpointSourceTypeNodeLocal,
		NodeLocal: &cpv1.NodeLocalCheckpointSource{Path: "../etc"}}
	_, err = admin.UpdateStatus(ctxT(t, 10*time.Second), bad)
	wantInvalid(t, "nodeLocal.path escaping the root", err, "nodeLocal.path")
}

// longNodeTicket: a node whose name is over 63 characters is routed by the
// hashed label value and the annotation with its full name; it may hold
// the object, and another long name sharing its first 30 characters (and
// so the label's prefix) may not.
func longNodeTicket(t *testing.T, ns string, admin, router *podcheckpoint.Client) {
	t.Helper()
	prefix := strings.Repeat("n", 30)
	long, twin := prefix+".long-node-"+strings.Repeat("a", 30), prefix+".long-node-"+strings.Repeat("b", 30)
	pc, err := admin.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, "hashed", "web-1", 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := router.Route(ctxT(t, 10*time.Second), ns, "hashed", pc.ResourceVersion, long); err != nil {
		t.Fatalf("the router routes to a long node name: %v", err)
	}
	if pc, err = admin.Get(ctxT(t, 10*time.Second), ns, "hashed"); err != nil {
		t.Fatal(err)
	}
	if pc.Labels[cpv1.NodeLabel] != cpv1.NodeLabelValue(long) || pc.Annotations[cpv1.NodeNameAnnotation] != long {
		t.Fatalf("routed to %s: labels %v, annotations %v", long, pc.Labels, pc.Annotations)
	}
	hold := func(c *podcheckpoint.Client, n string) error {
		mine := pc.DeepCopy()
		mine.Status.NodeName = n
		_, err := c.UpdateStatus(ctxT(t, 10*time.Second), mine)
		return err
	}
	err = hold(clientAs(t, "system:node:"+twin, "system:nodes"), twin)
	wantForbidden(t, "a long node name sharing the prefix holds the object", err, "not to node "+twin)
	if err := hold(clientAs(t, "system:node:"+long, "system:nodes"), long); err != nil {
		t.Errorf("the long-named node holds the object routed to it: %v", err)
	}
}
