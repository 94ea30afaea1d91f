package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Every pod name maps to a valid label value; short names are kept as they are.
func TestSourcePodKeyIsALabelValue(t *testing.T) {
	for _, name := range []string{
		"a", "web-0", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("a", 61) + ".-b" + strings.Repeat("c", 100),
		strings.Repeat("a.", 126) + "a",
	} {
		k := SourcePodKey(name)
		if errs := validation.IsValidLabelValue(k); len(errs) > 0 {
			t.Errorf("SourcePodKey(%q) = %q: %v", name, k, errs)
		}
		if len(name) <= 63 && k != name {
			t.Errorf("SourcePodKey(%q) = %q, want the name itself", name, k)
		}
	}
}
