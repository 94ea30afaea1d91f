package proxy

import (
	"context"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Checkpoint hooks serve the call themselves: the runtime under the shim
// does not implement the pod-level calls, so there is nothing to forward.

// CheckpointPodServer serves CheckpointPod.
type CheckpointPodServer interface {
	CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error)
}

// RestorePodServer serves RestorePod.
type RestorePodServer interface {
	RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error)
}

func checkpointHooks() []binder {
	return []binder{
		bindServer(CheckpointPod, CheckpointPodServer.CheckpointPod),
		bindServer(RestorePod, RestorePodServer.RestorePod),
	}
}

// bindServer binds a hook that serves its call without forwarding it.
func bindServer[H, Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method, call func(H, context.Context, *Req) (*Resp, error)) binder {
	return bindUnary[H, Req, Resp, PReq, PResp](m, func(h H, ctx context.Context, req *Req, _ UnaryNext[Req, Resp]) (*Resp, error) {
		return call(h, ctx, req)
	})
}
