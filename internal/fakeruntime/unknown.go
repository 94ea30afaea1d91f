package fakeruntime

import (
	"bytes"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// unknownField is a field number no CRI message of this build's cri-api
// uses (they stay far below it): a field a newer kubelet or runtime sends
// that this build does not know, as cri-api v0.38.0-beta.0 adds some.
const unknownField = 9999

// AddUnknown appends to m a field this build does not know, carrying tag:
// on the wire it is what a newer peer's new field is.
func AddUnknown(m proto.Message, tag string) {
	r := m.ProtoReflect()
	b := protowire.AppendTag(append([]byte(nil), r.GetUnknown()...), unknownField, protowire.BytesType)
	r.SetUnknown(protowire.AppendBytes(b, []byte(tag)))
}

// HasUnknown reports whether m carries the unknown field AddUnknown gave
// it with tag.
func HasUnknown(m proto.Message, tag string) bool {
	want := protowire.AppendBytes(protowire.AppendTag(nil, unknownField, protowire.BytesType), []byte(tag))
	return m != nil && m.ProtoReflect().IsValid() && bytes.Contains(m.ProtoReflect().GetUnknown(), want)
}
