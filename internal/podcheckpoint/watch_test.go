package podcheckpoint

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// The node selects by the keys of its ready sandboxes' pods, each once, in
// one set-based label selector; a name in two namespaces is two keys.
func TestSourceSelectorOfLocalPods(t *testing.T) {
	rt := &fakeRuntime{}
	long := strings.Repeat("x", 80)
	for i, p := range []struct{ ns, name string }{{"a", "web"}, {"b", "web"}, {"a", "db"}, {"a", long}} {
		rt.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, UID: types.UID(string(rune('0' + i)))}})
	}
	w := &Watches{rt: rt}
	keys := w.localKeys()
	if want := []string{"a.db", "a.web", "b.web", cpv1.SourcePodKey("a", long)}; !slices.Equal(keys, slices.Sorted(slices.Values(want))) {
		t.Errorf("keys %v", keys)
	}
	if got, want := sourceSelector([]string{"db", "web"}), cpv1.SourcePodLabel+" in (db,web)"; got != want {
		t.Errorf("selector %q, want %q", got, want)
	}
}
