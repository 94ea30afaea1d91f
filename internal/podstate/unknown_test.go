package podstate

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// A restart creates the container again from the kubelet's CreateContainer
// as it was sent, fields this build does not know included (a newer
// kubelet's): from the request kept in memory, and from the pod's record
// after a restart of the shim.
func TestReplayKeepsFieldsThisBuildDoesNotKnow(t *testing.T) {
	dir := t.TempDir()
	k := newKubelet(t, dir)
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": restartNotIn0})
	req := k.createReq(sb, "main", 0)
	fakeruntime.AddUnknown(req, "kubelet")
	fakeruntime.AddUnknown(req.Config, "kubelet")
	fakeruntime.AddUnknown(req.Config.Metadata, "kubelet")
	resp, err := k.m.CreateContainer(context.Background(), req, fwd(k.cri.CreateContainer))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.cri.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	for restart := 1; restart <= 3; restart++ {
		if restart == 3 {
			k = k.restarted(dir) // the record on disk is all the new shim has
		}
		k.exit(id, 1)
		k.status(id)
		if err := runSteps(k.m, context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		reqs := k.rt.Requests("CreateContainer")
		r := reqs[len(reqs)-1].(*runtimeapi.CreateContainerRequest)
		if r.Config.Metadata.Attempt != uint32(restart) {
			t.Fatalf("restart %d: the last create is attempt %d", restart, r.Config.Metadata.Attempt)
		}
		if !fakeruntime.HasUnknown(r, "kubelet") || !fakeruntime.HasUnknown(r.Config, "kubelet") || !fakeruntime.HasUnknown(r.Config.Metadata, "kubelet") {
			t.Fatalf("restart %d: the replayed create lost the kubelet's unknown fields", restart)
		}
		id = k.m.pods.Get(sb).Latest["main"]
	}
}
