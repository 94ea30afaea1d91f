package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Every node name maps to a valid label value; a short name is its own
// value, and long names that share a prefix map to different values.
func TestNodeLabelValueIsALabelValue(t *testing.T) {
	names := []string{
		"a", "node-1", "ip-10-0-0-1.ec2.internal", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("a", 30) + "." + strings.Repeat("b", 100),
		strings.Repeat("a.", 126) + "a",
	}
	seen := map[string]string{}
	for _, n := range names {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Fatalf("test name %q is not a node name: %v", n, errs)
		}
		v := NodeLabelValue(n)
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("NodeLabelValue(%q) = %q: %v", n, v, errs)
		}
		if len(n) <= 63 && v != n {
			t.Errorf("NodeLabelValue(%q) = %q, want the name", n, v)
		}
		if o, ok := seen[v]; ok {
			t.Errorf("%q and %q share the value %q", o, n, v)
		}
		seen[v] = n
	}
}

// An object is routed to a node when its label is the node's value; a
// hashed value also needs the full name in the annotation, so two long
// names sharing a prefix are told apart without a hash.
func TestRoutedTo(t *testing.T) {
	long := strings.Repeat("a", 30) + "." + strings.Repeat("b", 40)
	twin := strings.Repeat("a", 30) + "." + strings.Repeat("c", 40)
	for _, c := range []struct {
		labels, annotations map[string]string
		node                string
		want                bool
	}{
		{map[string]string{NodeLabel: "node-1"}, nil, "node-1", true},
		{map[string]string{NodeLabel: "node-1"}, nil, "node-2", false},
		{nil, nil, "node-1", false},
		{nil, nil, "", false},
		{map[string]string{NodeLabel: ""}, nil, "", false},
		{map[string]string{NodeLabel: NodeLabelValue(long)}, map[string]string{NodeNameAnnotation: long}, long, true},
		{map[string]string{NodeLabel: NodeLabelValue(long)}, nil, long, false},
		{map[string]string{NodeLabel: NodeLabelValue(long)}, map[string]string{NodeNameAnnotation: twin}, long, false},
		{map[string]string{NodeLabel: NodeLabelValue(long)}, map[string]string{NodeNameAnnotation: long}, twin, false},
	} {
		if got := RoutedTo(c.labels, c.annotations, c.node); got != c.want {
			t.Errorf("RoutedTo(%v, %v, %q) = %v, want %v", c.labels, c.annotations, c.node, got, c.want)
		}
	}
}
