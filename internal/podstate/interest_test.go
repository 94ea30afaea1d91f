package podstate

import (
	"context"
	"maps"
	"slices"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// Interest leaves out of Verdicts only containers it would show as they
// are: those of untracked pods, and containers a running tracked pod's
// record does not hold. During a restart every container of the pod is
// handed on (a create pending under its name hides it).
func TestInterest(t *testing.T) {
	k, sb, _ := crashingMainPod(t)
	ctx := context.Background()
	// A container of the tracked pod created behind the shim, named as the
	// one the restart will create, and a pod the shim does not track.
	stray, err := k.cri.CreateContainer(ctx, k.createReq(sb, "main", 7))
	if err != nil {
		t.Fatal(err)
	}
	other, err := k.cri.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "o", Namespace: "ns", Uid: "uid-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.cri.CreateContainer(ctx, k.createReq(other.PodSandboxId, "main", 3)); err != nil {
		t.Fatal(err)
	}
	decide := func() map[string]bool {
		list, err := k.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		heads, _, restarting := k.m.Interest(nil)
		got := map[string]bool{}
		for _, c := range list.Containers {
			got[c.Id] = heads.Has(wire.IDHead([]byte(c.Id))) || slices.Contains(restarting, c.PodSandboxId)
		}
		return got
	}
	var mainID string
	for id, in := range k.m.pods.Get(sb).Instances {
		if in.Name == "main" {
			mainID = id
		}
	}
	got := decide()
	if !got[mainID] || got[stray.ContainerId] || len(got) != 3 {
		t.Fatalf("running pod: Interest %v; want only the instance %s", got, mainID)
	}
	if enc, dec := k.list(), decodedList(t, k); !maps.Equal(enc, dec) {
		t.Fatalf("running pod: encoded list %v, decoded %v", enc, dec)
	}

	// A restart creating main: the stray container is hidden.
	k.m.mu.Lock()
	p := k.m.pods.Get(sb)
	p.Phase, p.Creating = restartrecord.PhaseStartup, "main/0"
	k.m.mu.Unlock()
	got = decide()
	if !got[mainID] || !got[stray.ContainerId] {
		t.Fatalf("restarting pod: Interest %v; want both of its containers", got)
	}
	enc, dec := k.list(), decodedList(t, k)
	if _, shown := dec[stray.ContainerId]; shown {
		t.Fatalf("the decoded list shows the container whose create is pending: %v", dec)
	}
	if !maps.Equal(enc, dec) {
		t.Fatalf("restarting pod: encoded list %v, decoded %v", enc, dec)
	}
}

// decodedList is the kubelet's list as the decoded path shows it: the
// runtime's list, every container handed to Verdicts.
func decodedList(t *testing.T, k kubelet) map[string]runtimeapi.ContainerState {
	t.Helper()
	list, err := k.cri.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]wire.Container, len(list.Containers))
	for i, c := range list.Containers {
		cs[i] = wire.ContainerOf(c)
	}
	vs, err := k.m.Verdicts(context.Background(), cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]runtimeapi.ContainerState{}
	for i, c := range list.Containers {
		switch {
		case vs[i].Hide:
		case vs[i].Fake:
			out[c.Id] = runtimeapi.ContainerState_CONTAINER_RUNNING
		default:
			out[c.Id] = c.State
		}
	}
	return out
}
