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

// Next reads the first field of b and returns it with the rest of b. It
// reports a malformed field (an error from protowire). Unlike Each it takes
// no callback, so a loop over a large message allocates nothing.
func Next(b []byte) (f Field, rest []byte, err error) {
	num, typ, val, x, n := field(b)
	if n < 0 {
		return Field{}, nil, fieldError(b)
	}
	f = Field{Num: num, Type: typ, Raw: b[:n]}
	switch typ {
	case protowire.BytesType:
		f.Bytes = val
	case protowire.VarintType:
		f.Varint = x
	}
	return f, b[n:], nil
}

// field reads the first field of b: its number and type, its value (val
// for BytesType, x for VarintType) and its length n, tag included; n < 0
// when it is malformed (fieldError says how). Most fields of a CRI message
// have a one-byte tag and a varint or a value shorter than 16 KiB: they
// are read here; the others by protowire.
func field(b []byte) (num protowire.Number, typ protowire.Type, val []byte, x uint64, n int) {
	if len(b) >= 2 && b[0] < 0x80 && b[0]>>3 != 0 {
		num, typ = protowire.Number(b[0]>>3), protowire.Type(b[0]&7)
		switch typ {
		case protowire.VarintType:
			if b[1] < 0x80 {
				return num, typ, nil, uint64(b[1]), 2
			}
			if x, m := protowire.ConsumeVarint(b[1:]); m > 0 {
				return num, typ, nil, x, 1 + m // a timestamp, say
			}
		case protowire.BytesType:
			l, m := int(b[1]), 2
			if b[1] >= 0x80 { // a length of two bytes: up to 16 KiB
				if len(b) < 3 || b[2] >= 0x80 {
					break
				}
				l, m = int(b[1]&0x7f)|int(b[2])<<7, 3
			}
			if m+l <= len(b) {
				return num, typ, b[m : m+l], 0, m + l
			}
		}
	}
	return fieldSlow(b)
}

// fieldSlow is field for any field protowire reads.
func fieldSlow(b []byte) (num protowire.Number, typ protowire.Type, val []byte, x uint64, n int) {
	num, typ, n = protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, 0, n
	}
	var m int
	switch typ {
	case protowire.BytesType:
		val, m = protowire.ConsumeBytes(b[n:])
	case protowire.VarintType:
		x, m = protowire.ConsumeVarint(b[n:])
	default:
		m = protowire.ConsumeFieldValue(num, typ, b[n:])
	}
	if m < 0 {
		return num, typ, nil, 0, m
	}
	return num, typ, val, x, n + m
}

// fieldError is the error of the malformed first field of b.
func fieldError(b []byte) error {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return fmt.Errorf("wire: tag: %w", protowire.ParseError(n))
	}
	return fmt.Errorf("wire: field %d: %w", num, protowire.ParseError(protowire.ConsumeFieldValue(num, typ, b[n:])))
}

// Each calls fn for every field of b in order, until fn returns an error,
// which Each returns (Stop: nil). It reports a malformed message (an error
// from protowire) and stops there.
func Each(b []byte, fn func(f Field) error) error {
	for len(b) > 0 {
		f, rest, err := Next(b)
		if err != nil {
			return err
		}
		b = rest
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
