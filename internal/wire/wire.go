// Package wire reads the few fields of an encoded CRI message that a feature
// needs to decide whether it has anything to do with the message, without
// decoding it. A kubelet reads container statuses and lists many times per
// second; most of them go through the shim unchanged, and decoding and
// re-encoding each one was most of the shim's CPU under a crash loop
// (docs/backoff.md). What this package cannot read is reported as an error,
// and callers then take the decoded path, so a peek never changes a result.
package wire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field is one field of an encoded message: for BytesType, Bytes holds its
// value (a string, bytes or an embedded message); for VarintType, Varint.
// Raw is the whole field, tag included, as it appears in the message.
type Field struct {
	Num    protowire.Number
	Type   protowire.Type
	Bytes  []byte
	Varint uint64
	Raw    []byte
}

// Stop, returned by Each's fn, ends the walk early without an error.
var Stop = errors.New("wire: stop")

// Each calls fn for every field of b in order, until fn returns an error,
// which Each returns (Stop: nil). It reports a malformed message (an error
// from protowire) and stops there.
func Each(b []byte, fn func(f Field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("wire: tag: %w", protowire.ParseError(n))
		}
		f := Field{Num: num, Type: typ}
		var m int
		switch typ {
		case protowire.BytesType:
			f.Bytes, m = protowire.ConsumeBytes(b[n:])
		case protowire.VarintType:
			f.Varint, m = protowire.ConsumeVarint(b[n:])
		default:
			m = protowire.ConsumeFieldValue(num, typ, b[n:])
		}
		if m < 0 {
			return fmt.Errorf("wire: field %d: %w", num, protowire.ParseError(m))
		}
		f.Raw = b[:n+m]
		b = b[n+m:]
		if err := fn(f); err != nil {
			if err == Stop {
				return nil
			}
			return err
		}
	}
	return nil
}

// String is the last value of string field num in b (proto3: the last
// occurrence wins) and whether it occurs.
func String(b []byte, num protowire.Number) (string, bool, error) {
	var v []byte
	found := false
	err := Each(b, func(f Field) error {
		if f.Num == num && f.Type == protowire.BytesType {
			v, found = f.Bytes, true
		}
		return nil
	})
	return string(v), found, err
}
