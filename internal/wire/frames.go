package wire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// A gRPC message arrives in several buffers, one per HTTP/2 data frame (16
// KiB at most). EachInFrames reads a message in those buffers, without
// joining them: a node's container list is close to a megabyte, and a copy
// of it per relist was most of what the shim added to a bare forwarder.

// EachInFrames calls fn with the value of every field num of type bytes
// (an embedded message, say) of the message made of frames, in order, and
// skips the other fields. A value within one frame is passed as a part of
// it; one across frames is first copied to the end of arena, and EachInFrames
// returns arena with what it appended (a value passed to fn stays valid as
// long as frames and the arrays arena had). It reports a malformed message,
// and fields of the deprecated group type, as errors.
func EachInFrames(frames [][]byte, num protowire.Number, arena []byte, fn func(v []byte) error) ([]byte, error) {
	r := frameReader{frames: frames}
	for _, f := range frames {
		r.rest += len(f)
	}
	for !r.done() {
		tag, err := r.varint()
		if err != nil {
			return arena, err
		}
		n, typ := protowire.DecodeTag(tag)
		if n < protowire.MinValidNumber || tag>>3 > uint64(protowire.MaxValidNumber) {
			return arena, fmt.Errorf("wire: field number %d out of range", tag>>3)
		}
		switch typ {
		case protowire.VarintType:
			_, err = r.varint()
		case protowire.Fixed32Type:
			err = r.skip(4)
		case protowire.Fixed64Type:
			err = r.skip(8)
		case protowire.BytesType:
			var l uint64
			if l, err = r.varint(); err != nil {
				break
			}
			if l > uint64(r.rest) {
				err = errTruncated
				break
			}
			if n != num {
				err = r.skip(int(l))
				break
			}
			var v []byte
			v, arena = r.take(int(l), arena)
			err = fn(v)
		default:
			err = fmt.Errorf("wire: field %d of type %d", n, typ)
		}
		if err != nil {
			return arena, err
		}
	}
	return arena, nil
}

var errTruncated = errors.New("wire: message ends inside a field")

// frameReader reads a message across the frames it arrived in.
type frameReader struct {
	frames [][]byte
	i, off int // the next byte: frames[i][off]
	rest   int // bytes not read yet
}

func (r *frameReader) done() bool {
	for r.i < len(r.frames) && r.off == len(r.frames[r.i]) {
		r.i, r.off = r.i+1, 0
	}
	return r.i == len(r.frames)
}

func (r *frameReader) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 70; shift += 7 {
		if r.done() {
			return 0, errTruncated
		}
		b := r.frames[r.i][r.off]
		r.off++
		r.rest--
		if shift == 63 && b > 1 {
			return 0, errors.New("wire: varint overflows 64 bits")
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("wire: varint longer than 10 bytes")
}

func (r *frameReader) skip(n int) error {
	for n > 0 {
		if r.done() {
			return errTruncated
		}
		k := min(n, len(r.frames[r.i])-r.off)
		r.off += k
		r.rest -= k
		n -= k
	}
	return nil
}

// take reads the next n bytes (n <= r.rest): a part of the current
// frame when they are all in it, else a copy appended to arena.
func (r *frameReader) take(n int, arena []byte) ([]byte, []byte) {
	r.done()
	if r.i < len(r.frames) && len(r.frames[r.i])-r.off >= n {
		v := r.frames[r.i][r.off : r.off+n : r.off+n]
		r.off += n
		r.rest -= n
		return v, arena
	}
	start := len(arena)
	for n > 0 {
		r.done()
		k := min(n, len(r.frames[r.i])-r.off)
		arena = append(arena, r.frames[r.i][r.off:r.off+k]...)
		r.off += k
		r.rest -= k
		n -= k
	}
	return arena[start:len(arena):len(arena)], arena
}
