package wire

import (
	"encoding/binary"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Container is what a feature needs to decide about one container: read
// off an encoded Container or ContainerStatus (PeekContainer, PeekStatus),
// or taken from a decoded one (ContainerOf).
type Container struct {
	ID, Sandbox, Name string
	State             runtimeapi.ContainerState
}

// ContainerOf is c's Container.
func ContainerOf(c *runtimeapi.Container) Container {
	return Container{ID: c.Id, Sandbox: c.PodSandboxId, Name: c.GetMetadata().GetName(), State: c.State}
}

// Field numbers in cri-api's api.proto.
const (
	fContainerID        = 1 // Container.id, ContainerStatus.id
	fContainerSandbox   = 2 // Container.pod_sandbox_id
	fContainerMeta      = 3 // Container.metadata
	fContainerState     = 6 // Container.state
	fStatusMeta         = 2 // ContainerStatus.metadata
	fStatusState        = 3 // ContainerStatus.state
	fMetaName           = 1 // ContainerMetadata.name
	FieldListContainers = 1 // ListContainersResponse.containers
	fListFilter         = 1 // ListContainersRequest.filter
	fStatusStatus       = 1 // ContainerStatusResponse.status
	fStatusReqID        = 1 // ContainerStatusRequest.container_id
	fStatusReqVerbose   = 2 // ContainerStatusRequest.verbose
	fSandboxStatusReqID = 1 // PodSandboxStatusRequest.pod_sandbox_id
)

// PeekStatusRequest reads an encoded ContainerStatusRequest: the container
// ID, and plain = not verbose (the last occurrence of a field wins; a
// verbose field of any non-zero value counts as verbose).
func PeekStatusRequest(b []byte) (id string, plain bool, err error) {
	plain = true
	err = Each(b, func(f Field) error {
		switch {
		case f.Num == fStatusReqID && f.Type == protowire.BytesType:
			id = string(f.Bytes)
		case f.Num == fStatusReqVerbose && f.Type == protowire.VarintType:
			plain = f.Varint == 0
		case f.Num == fStatusReqVerbose:
			plain = false // not how a bool is encoded: never answered from the cache
		}
		return nil
	})
	return id, plain, err
}

// metaName merges one occurrence of an embedded ContainerMetadata into name.
func metaName(b []byte, name *string) error {
	n, err := metaNameBytes(b, nil)
	if n != nil {
		*name = string(n)
	}
	return err
}

// metaNameBytes is the name in one occurrence of an embedded
// ContainerMetadata, or name when it has none.
func metaNameBytes(b, name []byte) ([]byte, error) {
	for len(b) > 0 {
		num, typ, val, _, n := field(b)
		if n < 0 {
			return name, fieldError(b)
		}
		b = b[n:]
		if num == fMetaName && typ == protowire.BytesType {
			name = val
		}
	}
	return name, nil
}

// ContainerBytes is Container as parts of the encoded message it was read
// from (PeekContainerBytes): reading it allocates nothing. A field that
// does not occur is nil.
type ContainerBytes struct {
	ID, Sandbox, Name []byte
	State             runtimeapi.ContainerState
	// Head is IDHead(ID), set by PeekContainerKey while the entry is in
	// the cache; 0 when not set.
	Head uint64
}

// IDHead is id's first 8 bytes as an integer, zero-padded when shorter:
// a lookup key that needs no hashing of the ID. containerd's IDs are 64
// random hex digits, so two rarely share one.
func IDHead(id []byte) uint64 {
	if len(id) >= 8 {
		return binary.LittleEndian.Uint64(id)
	}
	var b [8]byte
	copy(b[:], id)
	return binary.LittleEndian.Uint64(b[:])
}

// PeekContainerKey reads the ID and sandbox ID of an encoded Container
// from its first two fields, which is where containerd writes them:
// google.golang.org/protobuf marshals the fields of a message once each,
// in field-number order (internal/impl/codec_message.go sorts its coder
// fields by number), and id and pod_sandbox_id are fields 1 and 2. An
// entry that does not begin so is read whole (PeekContainerBytes). A
// repeated occurrence later in the entry is not looked for: the key only
// chooses which entries of a list are read whole, and one that chose
// wrongly in an encoding containerd does not make is shown unedited.
func PeekContainerKey(b []byte) (ContainerBytes, error) {
	num, typ, id, _, n := field(b)
	if n > 0 && num == fContainerID && typ == protowire.BytesType {
		if num, typ, sb, _, m := field(b[n:]); m > 0 && num == fContainerSandbox && typ == protowire.BytesType {
			return ContainerBytes{ID: id, Sandbox: sb, Head: IDHead(id)}, nil
		}
	}
	v, err := PeekContainerBytes(b)
	v.Head = IDHead(v.ID)
	return v, err
}

// PeekContainerBytes reads an encoded Container (one entry of a list)
// without copying: the fields point into b. Occurrences of a field merge
// as in proto decoding: the last one wins.
func PeekContainerBytes(b []byte) (ContainerBytes, error) {
	var v ContainerBytes
	for len(b) > 0 {
		num, typ, val, x, n := field(b)
		if n < 0 {
			return v, fieldError(b)
		}
		b = b[n:]
		switch {
		case num == fContainerID && typ == protowire.BytesType:
			v.ID = val
		case num == fContainerSandbox && typ == protowire.BytesType:
			v.Sandbox = val
		case num == fContainerMeta && typ == protowire.BytesType:
			var err error
			if v.Name, err = metaNameBytes(val, v.Name); err != nil {
				return v, err
			}
		case num == fContainerState && typ == protowire.VarintType:
			v.State = runtimeapi.ContainerState(int32(x))
		}
	}
	return v, nil
}

// PeekContainer reads an encoded Container (one entry of a list).
// Occurrences of a field merge as in proto decoding: the last one wins.
func PeekContainer(b []byte) (Container, error) {
	v, err := PeekContainerBytes(b)
	return Container{ID: string(v.ID), Sandbox: string(v.Sandbox), Name: string(v.Name), State: v.State}, err
}

// Containers copies cs out of the message they point into, with one
// allocation for all their strings (which therefore share one backing
// array for as long as any of them is kept).
func Containers(cs []ContainerBytes) []Container {
	n := 0
	for _, c := range cs {
		n += len(c.ID) + len(c.Sandbox) + len(c.Name)
	}
	var buf strings.Builder
	buf.Grow(n)
	for _, c := range cs {
		buf.Write(c.ID)
		buf.Write(c.Sandbox)
		buf.Write(c.Name)
	}
	all := buf.String()
	out := make([]Container, len(cs))
	at := 0
	take := func(b []byte) string {
		s := all[at : at+len(b)]
		at += len(b)
		return s
	}
	for i, c := range cs {
		out[i] = Container{ID: take(c.ID), Sandbox: take(c.Sandbox), Name: take(c.Name), State: c.State}
	}
	return out
}

// PeekStatus reads the status of an encoded ContainerStatusResponse; ok is
// false when the response carries no status.
func PeekStatus(b []byte) (v Container, ok bool, err error) {
	err = Each(b, func(f Field) error {
		if f.Num != fStatusStatus || f.Type != protowire.BytesType {
			return nil
		}
		ok = true
		return Each(f.Bytes, func(g Field) error {
			switch {
			case g.Num == fContainerID && g.Type == protowire.BytesType:
				v.ID = string(g.Bytes)
			case g.Num == fStatusMeta && g.Type == protowire.BytesType:
				return metaName(g.Bytes, &v.Name)
			case g.Num == fStatusState && g.Type == protowire.VarintType:
				v.State = runtimeapi.ContainerState(int32(g.Varint))
			}
			return nil
		})
	})
	return v, ok, err
}

// PeekSandboxStatusID reads the sandbox ID of an encoded
// PodSandboxStatusRequest (the last occurrence wins).
func PeekSandboxStatusID(b []byte) (string, error) {
	id, _, err := String(b, fSandboxStatusReqID)
	return id, err
}

// PeekListFilter reports whether an encoded ListContainersRequest has a
// filter that is not empty. Any filter field counts, known or not.
func PeekListFilter(b []byte) (filtered bool, err error) {
	err = Each(b, func(f Field) error {
		if f.Num == fListFilter && f.Type == protowire.BytesType && len(f.Bytes) > 0 {
			filtered = true
			return Stop
		}
		return nil
	})
	return filtered, err
}

// EditList applies per-entry verdicts to an encoded ListContainersResponse:
// hidden entries are left out, faked ones get state RUNNING appended (the last
// occurrence of a scalar field wins, so every reader sees RUNNING), the rest
// are copied byte for byte, unknown fields included.
func EditList(b []byte, verdicts []Verdict) ([]byte, error) {
	out := make([]byte, 0, len(b)+2*len(verdicts))
	i := 0
	err := Each(b, func(f Field) error {
		if f.Num != FieldListContainers || f.Type != protowire.BytesType {
			out = append(out, f.Raw...)
			return nil
		}
		v := verdicts[i]
		i++
		switch {
		case v.Hide:
		case v.Fake:
			out = protowire.AppendTag(out, FieldListContainers, protowire.BytesType)
			out = protowire.AppendVarint(out, uint64(len(f.Bytes)+2))
			out = append(out, f.Bytes...)
			out = protowire.AppendTag(out, fContainerState, protowire.VarintType)
			out = protowire.AppendVarint(out, uint64(runtimeapi.ContainerState_CONTAINER_RUNNING))
		default:
			out = append(out, f.Raw...)
		}
		return nil
	})
	return out, err
}

// Verdict is a feature's decision on one listed container.
type Verdict struct {
	Hide bool // not shown
	Fake bool // shown running although it is not
}
