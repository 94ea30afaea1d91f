package proxy

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec we delegate typed messages to
	"google.golang.org/grpc/mem"
)

// frame is one gRPC message carried as the bytes that arrived on the wire.
// Forwarding a frame never decodes it, so fields this build's cri-api does not
// know survive the trip, and the proxy pays no protobuf cost for calls it only routes.
type frame struct {
	data mem.BufferSlice
}

// free releases the buffers of a frame that will not be forwarded.
func (f *frame) free() {
	if f.data != nil {
		f.data.Free()
		f.data = nil
	}
}

// codec passes frames through as raw bytes and hands every other message to the
// proto codec, so the raw catch-all and typed routes share one server and one
// client connection.
type codec struct {
	proto encoding.CodecV2
}

func newCodec() *codec {
	return &codec{proto: encoding.GetCodecV2("proto")}
}

// Marshal hands a frame's buffers to gRPC, which frees them once written: the
// reference taken in Unmarshal moves with the message instead of being copied.
func (c *codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		out := f.data
		f.data = nil
		if out == nil {
			// An empty message is valid protobuf; gRPC still wants a slice.
			return mem.BufferSlice{}, nil
		}
		return out, nil
	}
	if c.proto == nil {
		return nil, fmt.Errorf("proxy codec: no proto codec registered for %T", v)
	}
	return c.proto.Marshal(v)
}

// Unmarshal keeps a reference to the received buffers instead of decoding them.
func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.free()
		data.Ref()
		f.data = data
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// Name is "proto": on the wire the proxy is indistinguishable from a protobuf peer.
func (c *codec) Name() string { return "proto" }
