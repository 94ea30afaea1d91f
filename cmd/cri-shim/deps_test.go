package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// builtinGroups are the only k8s.io/api packages the shim links: the API
// features call pods, nodes and events and nothing else
// (internal/kubeapi.Resources). Add a group here only for a call that needs it.
var builtinGroups = []string{"k8s.io/api/core/v1", "k8s.io/api/events/v1"}

// The binary does not link client-go's typed clientset or its scheme: they
// register every API group of Kubernetes, which doubled the binary and the
// start-up memory of a shim that never talks to the API server
// (bench/results/footprint-*.txt). client-go's tools/events imports them, so
// it is out as well, and so is tools/record, whose strategic merge patch
// brings kube-openapi and gnostic (4 MB of binary).
func TestBinaryHasNoClientset(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("go not on PATH: the dependencies are listed with it: %v", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "k8s.io/client-go/rest") {
		t.Fatalf("k8s.io/client-go/rest not among the %d dependencies: the list is not the binary's", len(deps))
	}
	for _, d := range deps {
		switch {
		case d == "k8s.io/client-go/kubernetes" || strings.HasPrefix(d, "k8s.io/client-go/kubernetes/"):
			t.Errorf("the binary links %s; call the API through internal/kubeapi.Resources", d)
		case strings.HasPrefix(d, "k8s.io/api/") && !slices.Contains(builtinGroups, d):
			t.Errorf("the binary links API group %s, beyond %v", d, builtinGroups)
		case d == "k8s.io/client-go/tools/record" || d == "k8s.io/apimachinery/pkg/util/strategicpatch":
			// tools/record links strategicpatch and kube-openapi (4 MB);
			// internal/kubeapi rebuilds its spam filter from flowcontrol.
			t.Errorf("the binary links %s", d)
		}
	}
}
