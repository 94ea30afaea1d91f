package proxy

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type sandboxStatusWatcher struct {
	mu   sync.Mutex
	seen []string
}

func (w *sandboxStatusWatcher) ObservePodSandboxStatus(req []byte) {
	var r runtimeapi.PodSandboxStatusRequest
	if err := proto.Unmarshal(req, &r); err != nil {
		r.PodSandboxId = "undecodable: " + err.Error()
	}
	w.mu.Lock()
	w.seen = append(w.seen, r.PodSandboxId)
	w.mu.Unlock()
}

// A PodSandboxStatusObserver is shown each request as the kubelet encoded it,
// before the call is forwarded raw: the answer is the runtime's, unchanged.
func TestPodSandboxStatusObserverSeesRequestAndForwardsRaw(t *testing.T) {
	w := &sandboxStatusWatcher{}
	var route hookRoute
	for _, b := range statusHooks() {
		if b.method != PodSandboxStatus {
			continue
		}
		r, ok := b.bind(w, always)
		if !ok {
			t.Fatal("a PodSandboxStatusObserver is not bound to PodSandboxStatus")
		}
		route = r
	}
	if route.Handler == nil {
		t.Fatal("no binder for PodSandboxStatus")
	}
	fx := newFixture(t, route)
	sb, _ := fx.runPod(t, 1, nil)
	ctx := context.Background()
	req := &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb}
	got, err := runtimeapi.NewRuntimeServiceClient(fx.shim).PodSandboxStatus(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := runtimeapi.NewRuntimeServiceClient(fx.direct).PodSandboxStatus(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("through the shim %v, direct %v", got, want)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) != 1 || w.seen[0] != sb {
		t.Fatalf("observer saw %q, want one request for %s", w.seen, sb)
	}
}
