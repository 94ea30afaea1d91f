package podstate

import (
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/wire"
)

// cview is what the restart view needs of one container: from a decoded
// Container, or read off an encoded one (peekContainer).
type cview struct {
	id, sandbox, name string
	state             runtimeapi.ContainerState
}

func viewOf(c *runtimeapi.Container) cview {
	return cview{id: c.Id, sandbox: c.PodSandboxId, name: c.GetMetadata().GetName(), state: c.State}
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
	fListContainers     = 1 // ListContainersResponse.containers
	fListFilter         = 1 // ListContainersRequest.filter
	fStatusStatus       = 1 // ContainerStatusResponse.status
	fStatusReqID        = 1 // ContainerStatusRequest.container_id
	fStatusReqVerbose   = 2 // ContainerStatusRequest.verbose
	fSandboxStatusReqID = 1 // PodSandboxStatusRequest.pod_sandbox_id
)

// peekStatusRequest reads an encoded ContainerStatusRequest: the container
// ID, and plain = not verbose (the last occurrence of a field wins; a
// verbose field of any non-zero value counts as verbose).
func peekStatusRequest(b []byte) (id string, plain bool, err error) {
	plain = true
	err = wire.Each(b, func(f wire.Field) error {
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
	return wire.Each(b, func(f wire.Field) error {
		if f.Num == fMetaName && f.Type == protowire.BytesType {
			*name = string(f.Bytes)
		}
		return nil
	})
}

// peekContainer reads an encoded Container (one entry of a list).
// Occurrences of a field merge as in proto decoding: the last one wins.
func peekContainer(b []byte) (cview, error) {
	var v cview
	err := wire.Each(b, func(f wire.Field) error {
		switch {
		case f.Num == fContainerID && f.Type == protowire.BytesType:
			v.id = string(f.Bytes)
		case f.Num == fContainerSandbox && f.Type == protowire.BytesType:
			v.sandbox = string(f.Bytes)
		case f.Num == fContainerMeta && f.Type == protowire.BytesType:
			return metaName(f.Bytes, &v.name)
		case f.Num == fContainerState && f.Type == protowire.VarintType:
			v.state = runtimeapi.ContainerState(int32(f.Varint))
		}
		return nil
	})
	return v, err
}

// peekStatus reads the status of an encoded ContainerStatusResponse; ok is
// false when the response carries no status.
func peekStatus(b []byte) (v cview, ok bool, err error) {
	err = wire.Each(b, func(f wire.Field) error {
		if f.Num != fStatusStatus || f.Type != protowire.BytesType {
			return nil
		}
		ok = true
		return wire.Each(f.Bytes, func(g wire.Field) error {
			switch {
			case g.Num == fContainerID && g.Type == protowire.BytesType:
				v.id = string(g.Bytes)
			case g.Num == fStatusMeta && g.Type == protowire.BytesType:
				return metaName(g.Bytes, &v.name)
			case g.Num == fStatusState && g.Type == protowire.VarintType:
				v.state = runtimeapi.ContainerState(int32(g.Varint))
			}
			return nil
		})
	})
	return v, ok, err
}

// peekSandboxStatusID reads the sandbox ID of an encoded
// PodSandboxStatusRequest (the last occurrence wins).
func peekSandboxStatusID(b []byte) (id string, err error) {
	err = wire.Each(b, func(f wire.Field) error {
		if f.Num == fSandboxStatusReqID && f.Type == protowire.BytesType {
			id = string(f.Bytes)
		}
		return nil
	})
	return id, err
}

// peekListFilter reports whether an encoded ListContainersRequest has a
// filter that is not empty. Any filter field counts, known or not.
func peekListFilter(b []byte) (filtered bool, err error) {
	err = wire.Each(b, func(f wire.Field) error {
		if f.Num == fListFilter && f.Type == protowire.BytesType && len(f.Bytes) > 0 {
			filtered = true
			return wire.Stop
		}
		return nil
	})
	return filtered, err
}

// editList applies per-entry verdicts to an encoded ListContainersResponse:
// hidden entries are left out, faked ones get state RUNNING appended (the last
// occurrence of a scalar field wins, so every reader sees RUNNING), the rest
// are copied byte for byte, unknown fields included.
func editList(b []byte, verdicts []verdict) ([]byte, error) {
	out := make([]byte, 0, len(b)+2*len(verdicts))
	i := 0
	err := wire.Each(b, func(f wire.Field) error {
		if f.Num != fListContainers || f.Type != protowire.BytesType {
			out = append(out, f.Raw...)
			return nil
		}
		v := verdicts[i]
		i++
		switch {
		case v.hide:
		case v.fake:
			out = protowire.AppendTag(out, fListContainers, protowire.BytesType)
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

// verdict is the view's decision on one listed container.
type verdict struct {
	hide bool // not shown (a new instance during a restart, or filtered out)
	fake bool // shown running although it is not
}
