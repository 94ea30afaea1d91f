package fakeruntime_test

import (
	"slices"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

func TestImagesPulledListedAndRemoved(t *testing.T) {
	rt := fakeruntime.Start(t)
	img := rt.ImageClient()
	spec := &runtimeapi.ImageSpec{Image: "busybox"} // the image create uses
	if st, err := img.ImageStatus(ctxT(t), &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.Image != nil {
		t.Fatalf("an image never pulled: %v %v", st, err)
	}
	pulled, err := img.PullImage(ctxT(t), &runtimeapi.PullImageRequest{Image: spec})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{spec.Image, pulled.ImageRef} {
		st, err := img.ImageStatus(ctxT(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil || st.Image.GetId() != pulled.ImageRef || !slices.Contains(st.Image.RepoTags, spec.Image) {
			t.Fatalf("status by %q: %v %v", name, st, err)
		}
	}
	sb := runPod(t, rt, nil)
	if s := cstatus(t, rt, create(t, rt, sb, "main", 0)); s.ImageRef != pulled.ImageRef {
		t.Fatalf("container image ref %q, want the pulled %q", s.ImageRef, pulled.ImageRef)
	}
	if l, err := img.ListImages(ctxT(t), &runtimeapi.ListImagesRequest{}); err != nil || len(l.Images) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	for range 2 { // the second removal is of an unknown image: success
		if _, err := img.RemoveImage(ctxT(t), &runtimeapi.RemoveImageRequest{Image: spec}); err != nil {
			t.Fatal(err)
		}
	}
	if l, _ := img.ListImages(ctxT(t), &runtimeapi.ListImagesRequest{}); len(l.Images) != 0 {
		t.Fatalf("after removal: %v", l.Images)
	}
}
