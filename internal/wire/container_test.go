package wire

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
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
		v, err := PeekContainer(b)
		if err != nil || v != ContainerOf(&c) {
			t.Fatalf("PeekContainer(%x) = %+v, %v; proto %+v", b, v, err, ContainerOf(&c))
		}
		// The state as the walk reads a quiet instance's: the last
		// occurrence, as proto decodes it.
		if w, err := PeekContainerBytes(b); err != nil || w.State != c.State {
			t.Fatalf("PeekContainerBytes(%x).State = %v, %v; proto %v", b, w.State, err, c.State)
		}
		// Re-encoded as containerd encodes, the key is read from the
		// first two fields and is the decoded message's.
		canon, err := proto.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		k, err := PeekContainerKey(canon)
		if err != nil || string(k.ID) != c.Id || string(k.Sandbox) != c.PodSandboxId || k.Head != IDHead([]byte(c.Id)) {
			t.Fatalf("PeekContainerKey(%x) = %q %q (head %x), %v; proto %q %q", canon, k.ID, k.Sandbox, k.Head, err, c.Id, c.PodSandboxId)
		}
	}
	var s runtimeapi.ContainerStatusResponse
	if proto.Unmarshal(b, &s) == nil {
		v, ok, err := PeekStatus(b)
		want := Container{ID: s.GetStatus().GetId(), Name: s.GetStatus().GetMetadata().GetName(), State: s.GetStatus().GetState()}
		if err != nil || ok != (s.Status != nil) || v != want {
			t.Fatalf("PeekStatus(%x) = %+v %v %v; proto %+v present %v", b, v, ok, err, want, s.Status != nil)
		}
	}
	var q runtimeapi.ContainerStatusRequest
	if proto.Unmarshal(b, &q) == nil {
		// plain must never be reported for a verbose request (its answer
		// could come from the kept exited statuses).
		id, plain, err := PeekStatusRequest(b)
		if err != nil || id != q.ContainerId || (plain && q.Verbose) {
			t.Fatalf("PeekStatusRequest(%x) = %q %v %v; proto %q verbose %v", b, id, plain, err, q.ContainerId, q.Verbose)
		}
	}
	var sr runtimeapi.PodSandboxStatusRequest
	if proto.Unmarshal(b, &sr) == nil {
		if id, err := PeekSandboxStatusID(b); err != nil || id != sr.PodSandboxId {
			t.Fatalf("PeekSandboxStatusID(%x) = %q, %v; proto %q", b, id, err, sr.PodSandboxId)
		}
	}
	var r runtimeapi.ListContainersRequest
	if proto.Unmarshal(b, &r) == nil {
		filtered, err := PeekListFilter(b)
		f := r.GetFilter()
		if err != nil || (!filtered && (f.GetState() != nil || f.GetId() != "" || f.GetPodSandboxId() != "" || len(f.GetLabelSelector()) > 0)) {
			t.Fatalf("PeekListFilter(%x) = %v, %v; proto filter %v", b, filtered, err, r.GetFilter())
		}
	}
}

func TestPeeksAgreeWithProto(t *testing.T) {
	c, _ := proto.Marshal(sampleContainer("c1", runtimeapi.ContainerState_CONTAINER_EXITED))
	checkPeeks(t, c)
	// Values past the one-byte path of field: a timestamp (a long varint),
	// a name and an annotation of two-byte lengths.
	long := sampleContainer("c2", runtimeapi.ContainerState_CONTAINER_RUNNING)
	long.CreatedAt, long.Metadata.Name = 1764400000123456789, strings.Repeat("n", 200)
	long.Annotations = map[string]string{"a": strings.Repeat("v", 5000)}
	c, _ = proto.Marshal(long)
	checkPeeks(t, c)
	if v, err := PeekContainer(c); err != nil || v.Name != long.Metadata.Name || v.State != long.State {
		t.Fatalf("PeekContainer of long values: %+v, %v", v, err)
	}
	s, _ := proto.Marshal(&runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "c1",
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"}, State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 3},
		Info: map[string]string{"info": "{}"}})
	checkPeeks(t, s)
	for _, q := range []*runtimeapi.ContainerStatusRequest{{ContainerId: "c1"}, {ContainerId: "c1", Verbose: true}} {
		b, _ := proto.Marshal(q)
		checkPeeks(t, b)
		if id, plain, err := PeekStatusRequest(b); err != nil || id != "c1" || plain == q.Verbose {
			t.Fatalf("PeekStatusRequest(%v) = %q %v %v", q, id, plain, err)
		}
	}
	if v, ok, err := PeekStatus(s); err != nil || !ok || v.ID != "c1" || v.Name != "main" || v.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("PeekStatus: %+v %v %v", v, ok, err)
	}
	for _, f := range []*runtimeapi.ContainerFilter{nil, {}, {Id: "x"}, {PodSandboxId: "sb"}, {State: &runtimeapi.ContainerStateValue{}},
		{LabelSelector: map[string]string{"a": "b"}}} {
		b, _ := proto.Marshal(&runtimeapi.ListContainersRequest{Filter: f})
		checkPeeks(t, b)
		got, _ := PeekListFilter(b)
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
	f.Add([]byte{0x30, 0x01, 0x0a, 0x01, 'c', 0x30, 0x02}) // the state twice: the last wins
	f.Fuzz(checkPeeks)
}

// EditList's bytes decode to what the decoded view gives, entry for entry.
func TestEditListMatchesDecodedView(t *testing.T) {
	cs := []*runtimeapi.Container{
		sampleContainer("keep", runtimeapi.ContainerState_CONTAINER_RUNNING),
		sampleContainer("hide", runtimeapi.ContainerState_CONTAINER_CREATED),
		sampleContainer("fake", runtimeapi.ContainerState_CONTAINER_EXITED),
		sampleContainer("fake0", runtimeapi.ContainerState_CONTAINER_CREATED), // state absent on the wire
	}
	b, _ := proto.Marshal(&runtimeapi.ListContainersResponse{Containers: cs})
	out, err := EditList(b, []Verdict{{}, {Hide: true}, {Fake: true}, {Fake: true}})
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

// PeekContainerKey takes the key from the leading fields when the entry is
// in containerd's order, and reads any other entry whole.
func TestPeekContainerKey(t *testing.T) {
	bytesField := func(num protowire.Number, v string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name        string
		entry       []byte
		id, sandbox string
	}{
		{"containerd's order", join(bytesField(1, "c1"), bytesField(2, "sb1"), bytesField(4, "img")), "c1", "sb1"},
		{"sandbox first: read whole", join(bytesField(2, "sb1"), bytesField(1, "c1")), "c1", "sb1"},
		{"metadata between: read whole, the last sandbox wins", join(bytesField(1, "c1"), bytesField(3, ""), bytesField(2, "sb1"), bytesField(2, "sb2")), "c1", "sb2"},
		{"leading key, repeated later: the leading one", join(bytesField(1, "c1"), bytesField(2, "sb1"), bytesField(2, "sb2")), "c1", "sb1"},
		{"no sandbox", bytesField(1, "c1"), "c1", ""},
	} {
		k, err := PeekContainerKey(tc.entry)
		if err != nil || string(k.ID) != tc.id || string(k.Sandbox) != tc.sandbox || k.Head != IDHead([]byte(tc.id)) {
			t.Errorf("%s: %q %q (head %x), %v; want %q %q", tc.name, k.ID, k.Sandbox, k.Head, err, tc.id, tc.sandbox)
		}
	}
	// The head is the ID's first 8 bytes, zero-padded: "c1" and "c1\x00"
	// share one, which only hands a container on to the engine's verdicts.
	if IDHead([]byte("c1")) != IDHead([]byte("c1\x00")) || IDHead([]byte("0123456789")) != IDHead([]byte("01234567xx")) ||
		IDHead([]byte("01234567")) == IDHead([]byte("01234568")) {
		t.Error("IDHead is not the ID's first 8 bytes")
	}
	if _, err := PeekContainerKey([]byte{0x0a, 0x05, 'c'}); err == nil {
		t.Error("a truncated entry was read")
	}
}
