package fakeruntime_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// An image is created from only once it is held; it is found by its name
// as containerd normalizes it, its ID and a prefix of the ID; a container's
// status names its image's tag while the image is held.
func TestImagesPulledListedAndRemoved(t *testing.T) {
	rt := fakeruntime.Start(t, fakeruntime.WithImages())
	img := rt.ImageClient()
	spec := &runtimeapi.ImageSpec{Image: "busybox"}
	if st, err := img.ImageStatus(ctxT(t), &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.Image != nil {
		t.Fatalf("an image never pulled: %v %v", st, err)
	}
	sb := runPod(t, rt, nil)
	createFrom := func(name, image string) (*runtimeapi.CreateContainerResponse, error) {
		return rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
			Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: image}},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	}
	_, err := createFrom("main", "busybox")
	wantErr(t, err, codes.NotFound, `failed to resolve image "busybox": not found`)
	pulled, err := img.PullImage(ctxT(t), &runtimeapi.PullImageRequest{Image: spec})
	if err != nil {
		t.Fatal(err)
	}
	const tag = "docker.io/library/busybox:latest"
	for _, name := range []string{spec.Image, tag, pulled.ImageRef, pulled.ImageRef[len("sha256:") : len("sha256:")+12]} {
		st, err := img.ImageStatus(ctxT(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil || st.Image.GetId() != pulled.ImageRef || !slices.Equal(st.Image.RepoTags, []string{tag}) {
			t.Fatalf("status by %q: %v %v", name, st, err)
		}
	}
	// The name failed above is free again (a failed create releases it).
	c, err := createFrom("main", "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if s := cstatus(t, rt, c.ContainerId); s.ImageRef != pulled.ImageRef || s.ImageId != pulled.ImageRef || s.Image.GetImage() != tag {
		t.Fatalf("container image %q ref %q id %q, want %q and the pulled %q", s.Image.GetImage(), s.ImageRef, s.ImageId, tag, pulled.ImageRef)
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
	if s := cstatus(t, rt, c.ContainerId); s.Image.GetImage() != "busybox" || s.ImageRef != pulled.ImageRef {
		t.Fatalf("container of a removed image: image %q ref %q, want the config's and the old ID", s.Image.GetImage(), s.ImageRef)
	}
}

// A new runtime holds the test node's images; an empty image reference is
// a prefix of every image ID, ambiguous among them.
func TestNodeImagesHeldFromTheStart(t *testing.T) {
	rt := fakeruntime.Start(t)
	l, err := rt.ImageClient().ListImages(ctxT(t), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, i := range l.Images {
		tags = append(tags, i.RepoTags...)
	}
	slices.Sort(tags)
	if want := slices.Sorted(slices.Values(fakeruntime.NodeImages)); !slices.Equal(tags, want) {
		t.Fatalf("images %v, want %v", tags, want)
	}
	sb := runPod(t, rt, nil)
	_, err = rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb,
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	wantErr(t, err, codes.Unknown, `failed to resolve image "": ambiguous digest string`)
}
