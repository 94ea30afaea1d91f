package fleet

import (
	"encoding/json"
	"testing"
)

// The audit count splits a node's requests into the shim's and the
// kubelet's by user agent, counts watches open, and flags every
// PodCheckpoint list or watch of a node that is not selected by its own
// name (the "no LIST or WATCH without a node-scoping selector").
func TestAuditCounts(t *testing.T) {
	lines := []string{
		`{"stage":"ResponseStarted","verb":"watch","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?labelSelector=checkpoint.cri-shim.io%2Fnode%3Dn1&watch=true","userAgent":"cri-shim/dev (node n1)","user":{"username":"system:node:n1"},"objectRef":{"resource":"podcheckpoints"}}`,
		`{"stage":"ResponseComplete","verb":"list","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?fieldSelector=status.nodeName%3Dn1","userAgent":"cri-shim/dev (node n1)","user":{"username":"system:node:n1"},"objectRef":{"resource":"podcheckpoints"},"responseStatus":{"code":200}}`,
		`{"stage":"ResponseComplete","verb":"list","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?labelSelector=checkpoint.cri-shim.io%2Fnode%3Dn2","userAgent":"cri-shim/dev (node n1)","user":{"username":"system:node:n1"},"objectRef":{"resource":"podcheckpoints"},"responseStatus":{"code":200}}`,
		`{"stage":"ResponseStarted","verb":"watch","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?watch=true","userAgent":"cri-shim/dev (node n1)","user":{"username":"system:node:n1"},"objectRef":{"resource":"podcheckpoints"}}`,
		`{"stage":"ResponseComplete","verb":"update","requestURI":"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1","userAgent":"kubelet-baseline/fleet","user":{"username":"system:node:n1"},"objectRef":{"resource":"leases"},"responseStatus":{"code":429}}`,
		`{"stage":"ResponseComplete","verb":"patch","requestURI":"/api/v1/namespaces/a/pods/p/status","userAgent":"cri-shim/dev (node n1)","user":{"username":"system:node:n1"},"objectRef":{"resource":"pods","subresource":"status","namespace":"a","name":"p"},"responseStatus":{"code":200}}`,
		`{"stage":"ResponseComplete","verb":"list","requestURI":"/api/v1/pods","userAgent":"kubectl","user":{"username":"admin"},"objectRef":{"resource":"pods"}}`,
	}
	pc := phaseCounts{side: [2]*counts{newCounts(), newCounts()}}
	for _, l := range lines {
		var e auditEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		pc.add(e)
	}
	s, k := pc.side[shim], pc.side[kubelet]
	if len(pc.unscoped) != 2 {
		t.Errorf("unscoped %v, want the other node's label and the bare watch", pc.unscoped)
	}
	if s.watchDelta["n1"] != 2 || s.perNode["n1"] != 3 || s.lists["n1"] != 2 || len(s.statusAt["a/p"]) != 1 {
		t.Errorf("shim: watches %d, requests %d, lists %d, status writes %v", s.watchDelta["n1"], s.perNode["n1"], s.lists["n1"], s.statusAt)
	}
	if k.perNode["n1"] != 1 || pc.leaseTooMany != 1 || k.codes[429] != 1 {
		t.Errorf("kubelet: requests %d, lease 429s %d", k.perNode["n1"], pc.leaseTooMany)
	}
}
