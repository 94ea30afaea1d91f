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
