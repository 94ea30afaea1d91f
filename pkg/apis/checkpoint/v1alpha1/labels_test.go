package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Every pod maps to a valid label value; a short key is "<namespace>.<name>"
// as it is, so one name in two namespaces has two keys.
func TestSourcePodKeyIsALabelValue(t *testing.T) {
	for _, ns := range []string{"a", "team-b", strings.Repeat("n", 63)} {
		for _, name := range []string{
			"a", "web-0", strings.Repeat("a", 63), strings.Repeat("a", 64),
			strings.Repeat("a", 61) + ".-b" + strings.Repeat("c", 100),
			strings.Repeat("a.", 126) + "a",
		} {
			k := SourcePodKey(ns, name)
			if errs := validation.IsValidLabelValue(k); len(errs) > 0 {
				t.Errorf("SourcePodKey(%q, %q) = %q: %v", ns, name, k, errs)
			}
			if full := ns + "." + name; len(full) <= 63 && k != full {
				t.Errorf("SourcePodKey(%q, %q) = %q, want %q", ns, name, k, full)
			}
		}
	}
	if SourcePodKey("a", "web") == SourcePodKey("b", "web") {
		t.Error("one pod name in two namespaces has one key")
	}
}
