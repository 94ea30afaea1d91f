package proxy

import (
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// Fields this build's cri-api does not know (a newer kubelet's or runtime's)
// survive every way the proxy serves a hooked call: a typed hook alone
// (decoded, re-encoded), a bytes hook alone, and a chain that decodes once
// and hands a typed link's request to a bytes link encoded again. The
// hooks change the answer (the taggers' IDs), and what they do not touch
// arrives as it was sent. internal/server's
// TestUnknownFieldsPassThroughEveryHook runs the shim's own features.
func TestUnknownFieldsThroughEveryKindOfRoute(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features []any
		wantID   string
	}{
		{"typed hook", []any{&tagger{tag: "+t"}}, "a+t"},
		{"bytes hook", []any{bytesStatus{}}, "a"},
		{"chain of typed and bytes hooks", []any{&tagger{tag: "+outer"}, &tagger{tag: "+inner"}, bytesStatus{}}, "a+inner+outer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := featureFixture(t, tc.features...)
			fx.rt.Rewrite("ContainerStatus", func(m proto.Message) {
				fakeruntime.AddUnknown(m, "runtime")
				fakeruntime.AddUnknown(m.(*runtimeapi.ContainerStatusResponse).Status, "runtime")
			})
			req := &runtimeapi.ContainerStatusRequest{ContainerId: "a"}
			fakeruntime.AddUnknown(req, "kubelet")
			r, err := runtimeapi.NewRuntimeServiceClient(fx.shim).ContainerStatus(ctxT(t), req)
			if err != nil || r.Status.Id != tc.wantID {
				t.Fatalf("status %v, %v; want ID %q", r, err, tc.wantID)
			}
			if !fakeruntime.HasUnknown(r, "runtime") || !fakeruntime.HasUnknown(r.Status, "runtime") {
				t.Errorf("the answer lost the runtime's unknown fields")
			}
			reqs := fx.rt.Requests("ContainerStatus")
			if len(reqs) != 1 || !fakeruntime.HasUnknown(reqs[0], "kubelet") {
				t.Errorf("the runtime got %v without the kubelet's unknown field", reqs)
			}
		})
	}
}
