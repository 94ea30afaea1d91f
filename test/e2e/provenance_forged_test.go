package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// forgedRecordsRefused (issue 44, acceptance 2): ref, a checkpoint of pod
// ns/src no node exported, is given export records a node could write only
// past the admission policy (written here as admin, routed by the router's
// identity): a holder that is not the node the object is routed to,
// Exported not True, a status.export.image outside spec.export's
// repository, and a record of another repository at the same digest.
// Provenance accepts none of them (the pod restoring from ref stays
// Pending, its event names a record turned down); then a record that holds
// (holder the routed node, Exported True, the repository pulled) is
// accepted, and a pod restores the source's memory from ref.
func forgedRecordsRefused(t *testing.T, cs kubernetes.Interface, pcs *podcheckpoint.Client, addr, ns, ref, secret string) {
	t.Helper()
	router := podCheckpoints(t, node.env["ROUTER_KUBECONFIG"])
	at := strings.LastIndex(ref, "@")
	repo, digest := ref[:at], ref[at+1:]
	elsewhere := addr + "/e2e/elsewhere-" + ns
	const otherNode = "e2e-other-node"
	forge := func(name, routed, holder, specImage, statusImage string, exported metav1.ConditionStatus) {
		t.Helper()
		pc := newPodCheckpoint(ns, name, "gone-0", 0) // no such pod: the node checkpoints nothing
		pc.Spec.Export = &cpv1.PodCheckpointExport{Image: specImage}
		pc, err := pcs.Create(ctxT(t, 10*time.Second), pc)
		if err != nil {
			t.Fatal(err)
		}
		if err := router.Route(ctxT(t, 10*time.Second), ns, name, pc.ResourceVersion, routed); err != nil {
			t.Fatal(err)
		}
		if pc, err = pcs.Get(ctxT(t, 10*time.Second), ns, name); err != nil {
			t.Fatal(err)
		}
		reason := cpv1.ReasonExported
		if exported != metav1.ConditionTrue {
			reason = cpv1.ReasonExportFailed
		}
		pc.Status.NodeName = holder
		pc.Status.Export = &cpv1.PodCheckpointExportStatus{Image: statusImage, Digest: digest, CompletionTime: &metav1.Time{Time: time.Now()}}
		pc.Status.Conditions = []metav1.Condition{{Type: cpv1.ConditionExported, Status: exported, Reason: reason,
			Message: "forged by the test", LastTransitionTime: metav1.Now()}}
		if _, err := pcs.UpdateStatus(ctxT(t, 10*time.Second), pc); err != nil {
			t.Fatalf("admin forges %s's status: %v", name, err)
		}
	}
	forge("forged-holder", node.env["NODE_NAME"], otherNode, repo+":v1", ref, metav1.ConditionTrue)
	forge("forged-unexported", otherNode, otherNode, repo+":v1", ref, metav1.ConditionFalse)
	forge("forged-repo", otherNode, otherNode, elsewhere+":v1", ref, metav1.ConditionTrue)
	forge("forged-elsewhere", otherNode, otherNode, elsewhere+":v1", elsewhere+"@"+digest, metav1.ConditionTrue)
	createPod(t, cs, ns, secretAPIPod("forged", ref))
	t.Logf("forged records: %s", sandboxEvent(t, cs, ns, "forged", "records the digest, but"))
	stillPending(t, cs, ns, "forged", secret)

	forge("true-record", otherNode, otherNode, repo+":v1", ref, metav1.ConditionTrue)
	createPod(t, cs, ns, secretAPIPod("accepted", ref))
	if got := runningSecret(t, cs, ns, "accepted", 3*time.Minute); got != secret {
		t.Fatalf("restored with a record that holds: secret %s, the source's is %s", got, secret)
	}
}
