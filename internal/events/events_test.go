package events

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podEvent is an event as containerd sends it: the sandbox status and every
// container's status, the event's own among them.
func podEvent(id string, t runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	labels := map[string]string{"io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": "u-1"}
	ev := &runtimeapi.ContainerEventResponse{
		ContainerId: id, ContainerEventType: t, CreatedAt: 42,
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sb-1", Labels: labels, Annotations: labels,
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "default", Uid: "u-1"}},
	}
	for _, c := range []string{"init", "main", "sidecar"} {
		ev.ContainersStatuses = append(ev.ContainersStatuses, &runtimeapi.ContainerStatus{
			Id: "c-" + c, Metadata: &runtimeapi.ContainerMetadata{Name: c, Attempt: 3},
			State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: int32(len(c)), Labels: labels, Annotations: labels,
		})
	}
	return ev
}

func TestParseReadsOnlyWhatItNeeds(t *testing.T) {
	b, err := proto.Marshal(podEvent("c-main", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	if err != nil {
		t.Fatal(err)
	}
	e, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if e.ContainerID != "c-main" || e.Type != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT || e.SandboxID != "sb-1" {
		t.Fatalf("parsed %q %v %q", e.ContainerID, e.Type, e.SandboxID)
	}
	s, err := e.Status()
	if err != nil || s == nil {
		t.Fatalf("status: %v %v", s, err)
	}
	if s.Id != "c-main" || s.GetMetadata().GetName() != "main" || s.ExitCode != 4 || s.GetMetadata().GetAttempt() != 3 {
		t.Fatalf("wrong status decoded: %v", s)
	}
	full, err := e.Full()
	if err != nil || full.CreatedAt != 42 || len(full.ContainersStatuses) != 3 {
		t.Fatalf("full: %v %v", full, err)
	}
}

func TestStatusAbsent(t *testing.T) {
	ev := podEvent("c-gone", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	b, _ := proto.Marshal(ev)
	e, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := e.Status(); s != nil || err != nil {
		t.Fatalf("status of a container the event does not carry: %v %v", s, err)
	}
	// The zero value of the event type (CREATED) is absent on the wire.
	b, _ = proto.Marshal(&runtimeapi.ContainerEventResponse{ContainerId: "x"})
	if e, err := Parse(b); err != nil || e.Type != runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT || e.SandboxID != "" {
		t.Fatalf("minimal event: %+v %v", e, err)
	}
}

func TestParseRefusesTruncated(t *testing.T) {
	b, _ := proto.Marshal(podEvent("c-main", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	for _, cut := range []int{1, 5, len(b) / 2, len(b) - 1} {
		e, err := Parse(b[:cut])
		if err == nil {
			// The cut may fall between fields; then Status must see the rest.
			if _, serr := e.Status(); serr == nil && proto.Unmarshal(b[:cut], &runtimeapi.ContainerEventResponse{}) != nil {
				t.Errorf("cut at %d: parsed although proto refuses it", cut)
			}
		}
	}
	if _, err := Parse([]byte{0x0a, 0x05, 'a'}); err == nil {
		t.Fatal("a length past the end was accepted")
	}
}

// Fields repeated on the wire resolve as proto decoding resolves them.
func TestParseMergesLikeProto(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, fieldSandbox, protowire.BytesType)
	b = protowire.AppendBytes(b, protowire.AppendString(protowire.AppendTag(nil, fieldID, protowire.BytesType), "first"))
	b = protowire.AppendTag(b, fieldSandbox, protowire.BytesType)
	b = protowire.AppendBytes(b, nil) // a later occurrence without an id keeps the first
	b = protowire.AppendTag(b, fieldContainerID, protowire.VarintType)
	b = protowire.AppendVarint(b, 7) // wrong wire type: an unknown field to proto
	checkAgainstProto(t, b)
	e, _ := Parse(b)
	if e.SandboxID != "first" || e.ContainerID != "" {
		t.Fatalf("got %+v", e)
	}
}

// checkAgainstProto fails when Parse and Status disagree with a full decode of
// a message that proto accepts.
func checkAgainstProto(t *testing.T, b []byte) {
	t.Helper()
	e, perr := Parse(b)
	var want runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &want); err != nil {
		return // proto refuses it; Parse must only not panic
	}
	if perr != nil {
		t.Fatalf("proto accepts %x but Parse refuses it: %v", b, perr)
	}
	if e.ContainerID != want.ContainerId || e.Type != want.ContainerEventType || e.SandboxID != want.GetPodSandboxStatus().GetId() {
		t.Fatalf("Parse %q/%v/%q, proto %q/%v/%q", e.ContainerID, e.Type, e.SandboxID,
			want.ContainerId, want.ContainerEventType, want.GetPodSandboxStatus().GetId())
	}
	var wantStatus *runtimeapi.ContainerStatus
	for _, s := range want.ContainersStatuses {
		if s.Id == want.ContainerId {
			wantStatus = s
		}
	}
	got, err := e.Status()
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if !proto.Equal(got, wantStatus) {
		t.Fatalf("Status %v, proto %v", got, wantStatus)
	}
}

func FuzzParse(f *testing.F) {
	for _, t := range []runtimeapi.ContainerEventType{0, 1, 2, 3} {
		b, _ := proto.Marshal(podEvent("c-main", t))
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x22, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		checkAgainstProto(t, b)
	})
}

func BenchmarkParseAndStatus(b *testing.B) {
	raw, _ := proto.Marshal(podEvent("c-main", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	b.Run("full-decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var e runtimeapi.ContainerEventResponse
			if err := proto.Unmarshal(raw, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		e := &Event{}
		for b.Loop() {
			if err := e.parse(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse+status", func(b *testing.B) {
		b.ReportAllocs()
		e := &Event{}
		for b.Loop() {
			if err := e.parse(raw); err != nil {
				b.Fatal(err)
			}
			if _, err := e.Status(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Full decodes the whole event, for subscribers that forward it.
func (e *Event) Full() (*runtimeapi.ContainerEventResponse, error) {
	r := &runtimeapi.ContainerEventResponse{}
	return r, proto.Unmarshal(e.raw, r)
}
