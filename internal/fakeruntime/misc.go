package fakeruntime

import (
	"context"
	"slices"

	"google.golang.org/protobuf/proto"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeName and RuntimeVersion are what Version answers.
const (
	RuntimeName    = "fakeruntime"
	RuntimeVersion = "v2.4.2-fake"
)

// Version answers as containerd does, under the fake's own name.
func (r *Runtime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: RuntimeName, RuntimeVersion: RuntimeVersion, RuntimeApiVersion: "v1"}, nil
}

// Status reports the runtime and its network ready.
func (r *Runtime) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: true}}}}, nil
}

// UpdateRuntimeConfig accepts any configuration.
func (r *Runtime) UpdateRuntimeConfig(context.Context, *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// PullImage records the image as present and answers its ID, as
// containerd's image_pull.go does (the digest of its config).
func (r *Runtime) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &runtimeapi.PullImageResponse{ImageRef: r.addImageLocked(req.GetImage().GetImage()).Id}, nil
}

// ImageStatus answers a nil image for one it cannot resolve, as containerd
// does (images/image_status.go).
func (r *Runtime) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	img, err := r.resolveLocked(req.GetImage().GetImage())
	if err != nil {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: proto.Clone(img).(*runtimeapi.Image)}, nil
}

// ListImages lists the pulled images.
func (r *Runtime) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &runtimeapi.ListImagesResponse{}
	for _, img := range r.images {
		out.Images = append(out.Images, proto.Clone(img).(*runtimeapi.Image))
	}
	slices.SortFunc(out.Images, func(a, b *runtimeapi.Image) int {
		if a.Id < b.Id {
			return -1
		}
		return 1
	})
	return out, nil
}

// RemoveImage forgets an image; an unknown one is success.
func (r *Runtime) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if img, err := r.resolveLocked(req.GetImage().GetImage()); err == nil {
		delete(r.images, img.Id)
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo reports no filesystems.
func (r *Runtime) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}
