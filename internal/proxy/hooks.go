package proxy

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// The shim's features take part in CRI calls through hooks: small interfaces,
// one per CRI method, declared in hooks_*.go by call group (sandbox
// lifecycle, container lifecycle, status and lists, streams, checkpoint). A
// feature implements only the hooks it needs; New binds every hook a
// feature implements, in the order the features are given. Methods no
// feature hooks are forwarded raw, undecoded.

// Method names a CRI method a feature can hook, for Activity.
type Method uint8

// The hookable methods.
const (
	RunPodSandbox Method = iota
	StopPodSandbox
	RemovePodSandbox
	CreateContainer
	StartContainer
	StopContainer
	RemoveContainer
	ContainerStatus
	ListContainers
	PodSandboxStatus
	StreamContainers
	GetContainerEvents
	CheckpointPod
	RestorePod
	numMethods
)

var methodNames = [numMethods]string{
	RunPodSandbox:      "RunPodSandbox",
	StopPodSandbox:     "StopPodSandbox",
	RemovePodSandbox:   "RemovePodSandbox",
	CreateContainer:    "CreateContainer",
	StartContainer:     "StartContainer",
	StopContainer:      "StopContainer",
	RemoveContainer:    "RemoveContainer",
	ContainerStatus:    "ContainerStatus",
	ListContainers:     "ListContainers",
	PodSandboxStatus:   "PodSandboxStatus",
	StreamContainers:   "StreamContainers",
	GetContainerEvents: "GetContainerEvents",
	CheckpointPod:      "CheckpointPod",
	RestorePod:         "RestorePod",
}

// String is the CRI method's short name.
func (m Method) String() string {
	if m < numMethods {
		return methodNames[m]
	}
	return fmt.Sprintf("Method(%d)", uint8(m))
}

// FullName is the gRPC method name, "/runtime.v1.RuntimeService/<name>".
func (m Method) FullName() string { return runtimeService + m.String() }

const runtimeService = "/runtime.v1.RuntimeService/"

// Activity is implemented by a feature that has nothing to do at times (no
// pod on the node uses it): while HookActive reports false for a method the
// feature is skipped for that call, and a call no active feature hooks is
// forwarded raw. It runs on every call of a hooked method: it must be cheap
// (an atomic load) and must not block. A feature without it is always active.
type Activity interface {
	HookActive(m Method) bool
}

// binder turns one hook a feature may implement into a route.
type binder struct {
	method Method
	bind   func(feature any, active func() bool) (hookRoute, bool)
}

// binders lists every hook the proxy declares, by call group.
func binders() []binder {
	var out []binder
	for _, group := range [][]binder{sandboxHooks(), containerHooks(), statusHooks(), streamHooks(), checkpointHooks()} {
		out = append(out, group...)
	}
	return out
}

// Takes reports whether feature implements a hook: New takes it.
func Takes(feature any) bool {
	for _, b := range binders() {
		if _, ok := b.bind(feature, nil); ok {
			return true
		}
	}
	return false
}

// routesOf binds the hooks of features, in the order given.
func routesOf(features []any) ([]hookRoute, error) {
	bs := binders()
	var routes []hookRoute
	for i, f := range features {
		if f == nil {
			return nil, fmt.Errorf("proxy: feature %d is nil", i)
		}
		a, _ := f.(Activity)
		n := 0
		for _, b := range bs {
			var active func() bool
			if a != nil {
				m := b.method
				active = func() bool { return a.HookActive(m) }
			}
			if r, ok := b.bind(f, active); ok {
				routes = append(routes, r)
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("proxy: feature %d (%T) implements no hook", i, f)
		}
	}
	return routes, nil
}

// bindUnary is the binder of a unary hook interface H, whose method call is
// given as a method expression (RunPodSandboxHook.RunPodSandbox).
func bindUnary[H, Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method, call func(H, context.Context, *Req, UnaryNext[Req, Resp]) (*Resp, error)) binder {
	return binder{m, func(f any, active func() bool) (hookRoute, bool) {
		h, ok := f.(H)
		if !ok {
			return hookRoute{}, false
		}
		return unaryHook[Req, Resp, PReq, PResp](m, active, func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error) {
			return call(h, ctx, req, next)
		}), true
	}}
}

// bindBytes is bindUnary for a bytes hook.
func bindBytes[H any](m Method, call func(H, context.Context, []byte, BytesNext) ([]byte, error)) binder {
	return binder{m, func(f any, active func() bool) (hookRoute, bool) {
		h, ok := f.(H)
		if !ok {
			return hookRoute{}, false
		}
		return unaryBytesIf(m.FullName(), orAlways(active), func(ctx context.Context, req []byte, next BytesNext) ([]byte, error) {
			return call(h, ctx, req, next)
		}), true
	}}
}

// bindFrames is bindBytes for a frames hook.
func bindFrames[H any](m Method, call func(H, context.Context, []byte, FramesNext) ([]byte, bool, error)) binder {
	return binder{m, func(f any, active func() bool) (hookRoute, bool) {
		h, ok := f.(H)
		if !ok {
			return hookRoute{}, false
		}
		return unaryFramesIf(m.FullName(), orAlways(active), func(ctx context.Context, req []byte, next FramesNext) ([]byte, bool, error) {
			return call(h, ctx, req, next)
		}), true
	}}
}
