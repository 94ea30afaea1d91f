package podstate

import (
	"context"
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func sampleContainer(id string, st runtimeapi.ContainerState) *runtimeapi.Container {
	l := map[string]string{"io.kubernetes.pod.name": "p", "io.kubernetes.container.name": "main"}
	return &runtimeapi.Container{Id: id, PodSandboxId: "sb1", Metadata: &runtimeapi.ContainerMetadata{Name: "main", Attempt: 2},
		Image: &runtimeapi.ImageSpec{Image: "busybox"}, ImageRef: "sha256:ab", State: st, CreatedAt: 7, Labels: l, Annotations: l}
}

// checkPeeks fails when a peek disagrees with proto decoding on a message
// that proto accepts.
func checkPeeks(t *testing.T, b []byte) {
	t.Helper()
	var c runtimeapi.Container
	if proto.Unmarshal(b, &c) == nil {
		v, err := peekContainer(b)
		if err != nil || v != viewOf(&c) {
			t.Fatalf("peekContainer(%x) = %+v, %v; proto %+v", b, v, err, viewOf(&c))
		}
	}
	var s runtimeapi.ContainerStatusResponse
	if proto.Unmarshal(b, &s) == nil {
		v, ok, err := peekStatus(b)
		want := cview{id: s.GetStatus().GetId(), name: s.GetStatus().GetMetadata().GetName(), state: s.GetStatus().GetState()}
		if err != nil || ok != (s.Status != nil) || v != want {
			t.Fatalf("peekStatus(%x) = %+v %v %v; proto %+v present %v", b, v, ok, err, want, s.Status != nil)
		}
	}
	var q runtimeapi.ContainerStatusRequest
	if proto.Unmarshal(b, &q) == nil {
		// plain must never be reported for a verbose request (its answer
		// could come from the kept exited statuses).
		id, plain, err := peekStatusRequest(b)
		if err != nil || id != q.ContainerId || (plain && q.Verbose) {
			t.Fatalf("peekStatusRequest(%x) = %q %v %v; proto %q verbose %v", b, id, plain, err, q.ContainerId, q.Verbose)
		}
	}
	var sr runtimeapi.PodSandboxStatusRequest
	if proto.Unmarshal(b, &sr) == nil {
		if id, err := peekSandboxStatusID(b); err != nil || id != sr.PodSandboxId {
			t.Fatalf("peekSandboxStatusID(%x) = %q, %v; proto %q", b, id, err, sr.PodSandboxId)
		}
	}
	var r runtimeapi.ListContainersRequest
	if proto.Unmarshal(b, &r) == nil {
		filtered, err := peekListFilter(b)
		f := r.GetFilter()
		if err != nil || (!filtered && (f.GetState() != nil || f.GetId() != "" || f.GetPodSandboxId() != "" || len(f.GetLabelSelector()) > 0)) {
			t.Fatalf("peekListFilter(%x) = %v, %v; proto filter %v", b, filtered, err, r.GetFilter())
		}
	}
}

func TestPeeksAgreeWithProto(t *testing.T) {
	c, _ := proto.Marshal(sampleContainer("c1", runtimeapi.ContainerState_CONTAINER_EXITED))
	checkPeeks(t, c)
	s, _ := proto.Marshal(&runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "c1",
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"}, State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 3},
		Info: map[string]string{"info": "{}"}})
	checkPeeks(t, s)
	for _, q := range []*runtimeapi.ContainerStatusRequest{{ContainerId: "c1"}, {ContainerId: "c1", Verbose: true}} {
		b, _ := proto.Marshal(q)
		checkPeeks(t, b)
		if id, plain, err := peekStatusRequest(b); err != nil || id != "c1" || plain == q.Verbose {
			t.Fatalf("peekStatusRequest(%v) = %q %v %v", q, id, plain, err)
		}
	}
	if v, ok, err := peekStatus(s); err != nil || !ok || v.id != "c1" || v.name != "main" || v.state != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("peekStatus: %+v %v %v", v, ok, err)
	}
	for _, f := range []*runtimeapi.ContainerFilter{nil, {}, {Id: "x"}, {PodSandboxId: "sb"}, {State: &runtimeapi.ContainerStateValue{}},
		{LabelSelector: map[string]string{"a": "b"}}} {
		b, _ := proto.Marshal(&runtimeapi.ListContainersRequest{Filter: f})
		checkPeeks(t, b)
		got, _ := peekListFilter(b)
		if want := f != nil && proto.Size(f) > 0; got != want {
			t.Fatalf("filter %v: peek says filtered=%v", f, got)
		}
	}
}

func FuzzPeeks(f *testing.F) {
	c, _ := proto.Marshal(sampleContainer("c1", runtimeapi.ContainerState_CONTAINER_EXITED))
	f.Add(c)
	s, _ := proto.Marshal(&runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "c1",
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"}, State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
	f.Add(s)
	r, _ := proto.Marshal(&runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: "sb"}})
	f.Add(r)
	f.Add([]byte{0x1a, 0x02, 0x0a, 0x00, 0x1a, 0x00})
	q, _ := proto.Marshal(&runtimeapi.ContainerStatusRequest{ContainerId: "c1", Verbose: true})
	f.Add(q)
	f.Add([]byte{0x0a, 0x02, 'c', '1', 0x10, 0x80, 0x01}) // verbose as a two-byte varint
	f.Fuzz(checkPeeks)
}

// editList's bytes decode to what the decoded view gives, entry for entry.
func TestEditListMatchesDecodedView(t *testing.T) {
	cs := []*runtimeapi.Container{
		sampleContainer("keep", runtimeapi.ContainerState_CONTAINER_RUNNING),
		sampleContainer("hide", runtimeapi.ContainerState_CONTAINER_CREATED),
		sampleContainer("fake", runtimeapi.ContainerState_CONTAINER_EXITED),
		sampleContainer("fake0", runtimeapi.ContainerState_CONTAINER_CREATED), // state absent on the wire
	}
	b, _ := proto.Marshal(&runtimeapi.ListContainersResponse{Containers: cs})
	out, err := editList(b, []verdict{{}, {hide: true}, {fake: true}, {fake: true}})
	if err != nil {
		t.Fatal(err)
	}
	var got runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := []*runtimeapi.Container{proto.Clone(cs[0]).(*runtimeapi.Container), proto.Clone(cs[2]).(*runtimeapi.Container), proto.Clone(cs[3]).(*runtimeapi.Container)}
	want[1].State, want[2].State = runtimeapi.ContainerState_CONTAINER_RUNNING, runtimeapi.ContainerState_CONTAINER_RUNNING
	if len(got.Containers) != len(want) {
		t.Fatalf("%d containers, want %d", len(got.Containers), len(want))
	}
	for i := range want {
		if !proto.Equal(got.Containers[i], want[i]) {
			t.Fatalf("entry %d: %v, want %v", i, got.Containers[i], want[i])
		}
	}
}

// During a restart the encoded paths show the kubelet exactly what the
// decoded ones do.
func TestBytesPathsMatchDecodedPaths(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	compare := func(when string) {
		t.Helper()
		typed, err := k.m.listContainers(context.Background(), &runtimeapi.ListContainersRequest{},
			func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
				return k.cri.ListContainers(ctx, r)
			})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]runtimeapi.ContainerState{}
		for _, c := range typed.Containers {
			want[c.Id] = c.State
		}
		if got := k.list(); !maps.Equal(got, want) {
			t.Fatalf("%s: encoded list %v, decoded %v", when, got, want)
		}
		for id := range want {
			ts, err := k.m.containerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id},
				func(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
					return k.cri.ContainerStatus(ctx, r)
				})
			if err != nil {
				t.Fatal(err)
			}
			if bs := k.status(id); !proto.Equal(bs, ts.Status) {
				t.Fatalf("%s: encoded status of %s %v, decoded %v", when, id, bs, ts.Status)
			}
		}
	}
	compare("running")
	k.exit(ids["main"], 88)
	compare("trigger exited")
	if k.m.pods[sb].Phase != PhaseTerminating {
		t.Fatalf("phase %s", k.m.pods[sb].Phase)
	}
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	compare("after the restart")
}
