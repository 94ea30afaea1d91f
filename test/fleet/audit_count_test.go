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
		`{"stage":"ResponseComplete","verb":"update","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/namespaces/a/podcheckpoints/x/status","userAgent":"cri-shim/dev (node n2)","user":{"username":"system:node:n2"},"objectRef":{"resource":"podcheckpoints","subresource":"status"},"responseStatus":{"code":200}}`,
		`{"stage":"ResponseComplete","verb":"update","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/namespaces/a/podcheckpoints/x/status","userAgent":"cri-shim/dev (node n3)","user":{"username":"system:node:n3"},"objectRef":{"resource":"podcheckpoints","subresource":"status"},"responseStatus":{"code":409}}`,
		`{"auditID":"w1","stage":"ResponseStarted","verb":"watch","requestURI":"/api/v1/pods?fieldSelector=spec.nodeName%3Dn3&sendInitialEvents=true&watch=true","requestReceivedTimestamp":"2026-11-27T10:00:00Z","userAgent":"cri-shim/dev (node n3)","user":{"username":"system:node:n3"},"objectRef":{"resource":"pods"}}`,
		`{"auditID":"w1","stage":"ResponseComplete","verb":"watch","requestURI":"/api/v1/pods?fieldSelector=spec.nodeName%3Dn3&sendInitialEvents=true&watch=true","requestReceivedTimestamp":"2026-11-27T10:00:00Z","stageTimestamp":"2026-11-27T10:00:02.5Z","userAgent":"cri-shim/dev (node n3)","user":{"username":"system:node:n3"},"objectRef":{"resource":"pods"},"responseStatus":{"code":500}}`,
		`{"auditID":"r1","stage":"ResponseStarted","verb":"watch","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?sendInitialEvents=true&watch=true","user":{"username":"system:serviceaccount:cri-shim-system:cri-shim-router"},"objectRef":{"resource":"podcheckpoints"}}`,
		`{"auditID":"r1","stage":"ResponseComplete","verb":"watch","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?sendInitialEvents=true&watch=true","user":{"username":"system:serviceaccount:cri-shim-system:cri-shim-router"},"objectRef":{"resource":"podcheckpoints"},"responseStatus":{"code":429}}`,
		`{"auditID":"r2","stage":"ResponseStarted","verb":"watch","requestURI":"/apis/checkpoint.cri-shim.io/v1alpha1/podcheckpoints?sendInitialEvents=true&watch=true","user":{"username":"system:serviceaccount:cri-shim-system:cri-shim-router"},"objectRef":{"resource":"podcheckpoints"}}`,
	}
	pc := newPhaseCounts()
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
	if s.pcpStatus["n2"] != 1 || s.pcpStatus["n3"] != 0 || s.conflicts["n3"] != 1 || s.conflicts["n2"] != 0 {
		t.Errorf("PodCheckpoint status writes taken %v, conflicts %v", s.pcpStatus, s.conflicts)
	}
	if l := s.listLog["n3"]; len(l) != 1 || l[0].String() != "watch-list pods at 10:00:00.0 (500 after 2.5 s)" || len(s.openLists) != 0 {
		t.Errorf("n3's lists %v, still open %v", l, s.openLists)
	}
	if s.lists["n3"] != 0 || s.refused["n3"] != 1 || s.pcpLists != 2 {
		t.Errorf("n3: lists %d, refused %d (want 0 and 1: the watch-list ended 500); PodCheckpoint lists %d", s.lists["n3"], s.refused["n3"], s.pcpLists)
	}
	if pc.routerLists != 1 {
		t.Errorf("router lists %d, want 1 (one served, one refused)", pc.routerLists)
	}
	if len(s.listLog["n1"]) != 2 {
		t.Errorf("n1's lists %v", s.listLog["n1"])
	}
	if k.perNode["n1"] != 1 || pc.leaseTooMany != 1 || k.codes[429] != 1 {
		t.Errorf("kubelet: requests %d, lease 429s %d", k.perNode["n1"], pc.leaseTooMany)
	}
}
