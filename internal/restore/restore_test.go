package restore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

func TestRestorePodCreatesContainersFromTheArchives(t *testing.T) {
	fx := checkpointed(t)
	resp, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.RestoredContainers) != 2 || resp.RestoredContainers[0].Name != "app" || resp.RestoredContainers[1].Name != "sidecar" {
		t.Fatalf("restored %v, want one per config in request order", resp.RestoredContainers)
	}
	cs := fx.rt.ContainersIn(t, resp.PodSandboxId)
	if len(cs) != 2 {
		t.Fatalf("%d containers in the new sandbox", len(cs))
	}
	for _, c := range cs {
		if c.Status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
			t.Errorf("%s is %s, want CREATED", c.Config.Metadata.Name, c.Status.State)
		}
		if c.Config.Image.Image != ckpttest.Busybox {
			t.Errorf("%s image %q, want the pod's own %q", c.Config.Metadata.Name, c.Config.Image.Image, ckpttest.Busybox)
		}
		want := ckpttest.ArchivePages(t, filepath.Join(fx.dir, layout.ArchiveName(c.Config.Metadata.Name)))
		if got := ckpttest.StagedPages(t, fx.rt.Marks, c.Status.Id); got != want {
			t.Errorf("%s staged %q, want its archive's %q", c.Config.Metadata.Name, got, want)
		}
		if c.Config.Annotations[capture.RestartCountAnnotation] != "2" {
			t.Errorf("%s restart count %q, want the checkpoint's 2", c.Config.Metadata.Name, c.Config.Annotations[capture.RestartCountAnnotation])
		}
	}
	// The checkpoint is not modified.
	if _, err := layout.ReadManifest(fx.dir); err != nil {
		t.Fatal(err)
	}
}

func TestRestorePodRefusals(t *testing.T) {
	fx := checkpointed(t)
	other := filepath.Join(fx.root, "nomanifest")
	os.Mkdir(other, 0o700)
	wrongImage := ckpttest.RestoreReq(fx.dir, "app", "sidecar")
	wrongImage.ContainerConfigs[0].Image.Image = "docker.io/library/nginx:latest"
	dup := ckpttest.RestoreReq(fx.dir, "app", "sidecar", "app")
	opt := ckpttest.RestoreReq(fx.dir, "app", "sidecar")
	opt.Options = map[string]string{"x": "y"}
	handler := ckpttest.RestoreReq(fx.dir, "app", "sidecar")
	handler.RuntimeHandler = "kata"
	noCfg := ckpttest.RestoreReq(fx.dir, "app", "sidecar")
	noCfg.Config = nil
	cases := []struct {
		name string
		req  *runtimeapi.RestorePodRequest
		code codes.Code
	}{
		{"missing name", ckpttest.RestoreReq(fx.dir, "app"), codes.InvalidArgument},
		{"extra name", ckpttest.RestoreReq(fx.dir, "app", "sidecar", "init"), codes.InvalidArgument},
		{"duplicate", dup, codes.InvalidArgument},
		{"no configs", ckpttest.RestoreReq(fx.dir), codes.InvalidArgument},
		{"wrong image", wrongImage, codes.InvalidArgument},
		{"unknown option", opt, codes.InvalidArgument},
		{"other handler", handler, codes.FailedPrecondition},
		{"no sandbox config", noCfg, codes.InvalidArgument},
		{"escape", ckpttest.RestoreReq(fx.root+"/../x", "app", "sidecar"), codes.InvalidArgument},
		{"outside", ckpttest.RestoreReq("/etc", "app", "sidecar"), codes.InvalidArgument},
		{"missing", ckpttest.RestoreReq(filepath.Join(fx.root, "gone"), "app", "sidecar"), codes.NotFound},
		{"not a checkpoint", ckpttest.RestoreReq(other, "app", "sidecar"), codes.NotFound},
	}
	for _, c := range cases {
		_, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), c.req)
		if status.Code(proxy.Status(err)) != c.code {
			t.Errorf("%s: got %v, want %s", c.name, err, c.code)
		}
	}
	if fx.rt.SandboxCount() != 2 {
		t.Fatalf("a refused restore created a sandbox")
	}
}

// The second container fails to restore: the first and the sandbox are removed.
func TestRestorePodFailureRemovesWhatItCreated(t *testing.T) {
	fx := checkpointed(t)
	fx.rt.FailCreate = 2
	sandboxes, containers := fx.rt.SandboxCount(), fx.rt.ContainerCount()
	_, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if status.Code(proxy.Status(err)) != codes.Internal || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("got %v", err)
	}
	if fx.rt.Creates != 2 {
		t.Fatalf("%d creates, want the first container and the failed second", fx.rt.Creates)
	}
	if s, c := fx.rt.SandboxCount(), fx.rt.ContainerCount(); s != sandboxes || c != containers {
		t.Errorf("left %d sandboxes and %d containers, had %d and %d", s, c, sandboxes, containers)
	}
}

// A checkpoint records its node's cgroup mode; a node of the other mode
// refuses it before anything is created, naming both.
func TestRestorePodRefusesAnotherCgroupMode(t *testing.T) {
	fx := checkpointed(t)
	m, err := layout.ReadManifest(fx.dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.CgroupMode != layout.NodeCgroupMode() {
		t.Fatalf("the manifest records cgroup mode %q, the node's is %q", m.CgroupMode, layout.NodeCgroupMode())
	}
	other := layout.CgroupV2
	if m.CgroupMode == layout.CgroupV2 {
		other = layout.CgroupV1
	}
	defer func(f func() string) { nodeCgroupMode = f }(nodeCgroupMode)
	nodeCgroupMode = func() string { return other }
	before := fx.rt.SandboxCount()
	_, err = fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cgroup "+m.CgroupMode+" node") {
		t.Fatalf("got %v, want FailedPrecondition naming the checkpoint's cgroup mode", err)
	}
	if fx.rt.SandboxCount() != before {
		t.Fatal("the refused restore created a sandbox")
	}
}

// The kubelet's configs in RestorePod, with fields this build does not know
// (a newer kubelet's), reach the runtime whole: the sandbox's in
// RunPodSandbox, each container's in its CreateContainer (restoredConfig
// adds to a copy).
func TestRestorePodKeepsFieldsThisBuildDoesNotKnow(t *testing.T) {
	fx := checkpointed(t)
	req := ckpttest.RestoreReq(fx.dir, "app", "sidecar")
	fakeruntime.AddUnknown(req.Config, "kubelet")
	for _, c := range req.ContainerConfigs {
		fakeruntime.AddUnknown(c, "kubelet")
		fakeruntime.AddUnknown(c.Metadata, "kubelet")
	}
	resp, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	runs := fx.rt.RT.Requests("RunPodSandbox")
	if r := runs[len(runs)-1].(*runtimeapi.RunPodSandboxRequest); !fakeruntime.HasUnknown(r.Config, "kubelet") {
		t.Errorf("the restored sandbox's config reached the runtime without the kubelet's unknown field")
	}
	cs := fx.rt.ContainersIn(t, resp.PodSandboxId)
	if len(cs) != 2 {
		t.Fatalf("%d containers restored", len(cs))
	}
	for _, c := range cs {
		if !fakeruntime.HasUnknown(c.Config, "kubelet") || !fakeruntime.HasUnknown(c.Config.Metadata, "kubelet") {
			t.Errorf("%s: its config reached the runtime without the kubelet's unknown fields", c.Config.Metadata.Name)
		}
		if c.Config.Annotations[RestoringAnnotation] != "true" {
			t.Errorf("%s: not created as a restore (annotations %v)", c.Config.Metadata.Name, c.Config.Annotations)
		}
	}
}
