package criu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

func checkpointed(t *testing.T) *fixture {
	t.Helper()
	return checkpointedWith(t, nil)
}

// checkpointedWith is checkpointed with the fixture set up by before (nil:
// as newFixture leaves it) before the checkpoint is taken.
func checkpointedWith(t *testing.T, before func(*fixture)) *fixture {
	t.Helper()
	fx := newFixture(t)
	if before != nil {
		before(fx)
	}
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	return fx
}

func ctrCfg(name string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:       &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"},
		Annotations: map[string]string{capture.RestartCountAnnotation: "0", "io.kubernetes.container.hash": "h"}}
}

func restoreReq(dir string, names ...string) *runtimeapi.RestorePodRequest {
	r := &runtimeapi.RestorePodRequest{CheckpointPath: dir,
		Config: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "copy", Namespace: "ns", Uid: "new-uid"}}}
	for _, n := range names {
		r.ContainerConfigs = append(r.ContainerConfigs, ctrCfg(n))
	}
	return r
}

func TestRestorePodCreatesContainersFromTheArchives(t *testing.T) {
	fx := checkpointed(t)
	resp, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), restoreReq(fx.dir, "app", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.RestoredContainers) != 2 || resp.RestoredContainers[0].Name != "app" || resp.RestoredContainers[1].Name != "sidecar" {
		t.Fatalf("restored %v, want one per config in request order", resp.RestoredContainers)
	}
	cs := fx.rt.containersIn(t, resp.PodSandboxId)
	if len(cs) != 2 {
		t.Fatalf("%d containers in the new sandbox", len(cs))
	}
	for _, c := range cs {
		if c.status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
			t.Errorf("%s is %s, want CREATED", c.config.Metadata.Name, c.status.State)
		}
		if c.config.Image.Image != busybox {
			t.Errorf("%s image %q, want the pod's own %q", c.config.Metadata.Name, c.config.Image.Image, busybox)
		}
		want := archivePages(t, filepath.Join(fx.dir, layout.ArchiveName(c.config.Metadata.Name)))
		if got := stagedPages(t, fx.svc, c.status.Id); got != want {
			t.Errorf("%s staged %q, want its archive's %q", c.config.Metadata.Name, got, want)
		}
		if c.config.Annotations[capture.RestartCountAnnotation] != "2" {
			t.Errorf("%s restart count %q, want the checkpoint's 2", c.config.Metadata.Name, c.config.Annotations[capture.RestartCountAnnotation])
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
	wrongImage := restoreReq(fx.dir, "app", "sidecar")
	wrongImage.ContainerConfigs[0].Image.Image = "docker.io/library/nginx:latest"
	dup := restoreReq(fx.dir, "app", "sidecar", "app")
	opt := restoreReq(fx.dir, "app", "sidecar")
	opt.Options = map[string]string{"x": "y"}
	handler := restoreReq(fx.dir, "app", "sidecar")
	handler.RuntimeHandler = "kata"
	noCfg := restoreReq(fx.dir, "app", "sidecar")
	noCfg.Config = nil
	cases := []struct {
		name string
		req  *runtimeapi.RestorePodRequest
		code codes.Code
	}{
		{"missing name", restoreReq(fx.dir, "app"), codes.InvalidArgument},
		{"extra name", restoreReq(fx.dir, "app", "sidecar", "init"), codes.InvalidArgument},
		{"duplicate", dup, codes.InvalidArgument},
		{"no configs", restoreReq(fx.dir), codes.InvalidArgument},
		{"wrong image", wrongImage, codes.InvalidArgument},
		{"unknown option", opt, codes.InvalidArgument},
		{"other handler", handler, codes.FailedPrecondition},
		{"no sandbox config", noCfg, codes.InvalidArgument},
		{"escape", restoreReq(fx.root+"/../x", "app", "sidecar"), codes.InvalidArgument},
		{"outside", restoreReq("/etc", "app", "sidecar"), codes.InvalidArgument},
		{"missing", restoreReq(filepath.Join(fx.root, "gone"), "app", "sidecar"), codes.NotFound},
		{"not a checkpoint", restoreReq(other, "app", "sidecar"), codes.NotFound},
	}
	for _, c := range cases {
		_, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), c.req)
		if status.Code(proxy.Status(err)) != c.code {
			t.Errorf("%s: got %v, want %s", c.name, err, c.code)
		}
	}
	if fx.rt.sandboxCount() != 2 {
		t.Fatalf("a refused restore created a sandbox")
	}
}

// The second container fails to restore: the first and the sandbox are removed.
func TestRestorePodFailureRemovesWhatItCreated(t *testing.T) {
	fx := checkpointed(t)
	fx.rt.failCreate = 2
	sandboxes, containers := fx.rt.sandboxCount(), fx.rt.containerCount()
	_, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), restoreReq(fx.dir, "app", "sidecar"))
	if status.Code(proxy.Status(err)) != codes.Internal || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("got %v", err)
	}
	if fx.rt.creates != 2 {
		t.Fatalf("%d creates, want the first container and the failed second", fx.rt.creates)
	}
	if s, c := fx.rt.sandboxCount(), fx.rt.containerCount(); s != sandboxes || c != containers {
		t.Errorf("left %d sandboxes and %d containers, had %d and %d", s, c, sandboxes, containers)
	}
}

// admit is the pod table's admission with the service alone.
func admit(svc *Service, rt *fakeRT) podtable.Admissions {
	return podtable.Admissions{Features: []podtable.Admitter{svc}, RT: rt, Log: svc.log}
}

func runSandbox(t *testing.T, svc *Service, rt *fakeRT, ann map[string]string) (*runtimeapi.RunPodSandboxResponse, error) {
	t.Helper()
	req := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "warm", Namespace: "ns", Uid: rt.uid("u2")}, Annotations: ann}}
	return admit(svc, rt).Run(ctxT(t, 5*time.Second), req, func(ctx context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
		return rt.RunPodSandbox(ctx, r)
	})
}

func createIn(t *testing.T, svc *Service, rt *fakeRT, sandbox, name string) *fakeCtr {
	t.Helper()
	resp, err := svc.CreateContainer(ctxT(t, 5*time.Second), rt.createReq(t, sandbox, name),
		func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return rt.CreateContainer(ctx, r)
		})
	if err != nil {
		t.Fatal(err)
	}
	return rt.container(t, resp.ContainerId)
}

func TestWarmStart(t *testing.T) {
	fx := newFixture(t)
	ann := map[string]string{podspec.RestoreFromKey: "later"}
	// No checkpoint yet: the sandbox fails with a clear message, nothing is created.
	_, err := runSandbox(t, fx.svc, fx.rt, ann)
	if status.Code(proxy.Status(err)) != codes.NotFound || !strings.Contains(err.Error(), "kubelet retries") {
		t.Fatalf("missing checkpoint: %v", err)
	}
	for _, bad := range []string{"../cp1", "a/b", ".", ""} {
		if _, err := runSandbox(t, fx.svc, fx.rt, map[string]string{podspec.RestoreFromKey: bad}); status.Code(proxy.Status(err)) != codes.InvalidArgument {
			t.Errorf("annotation %q: %v", bad, err)
		}
	}
	later := filepath.Join(fx.root, "later")
	os.Mkdir(later, 0o700)
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(later, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	sb, err := runSandbox(t, fx.svc, fx.rt, ann)
	if err != nil {
		t.Fatal(err)
	}
	// A restarted shim still knows the sandbox is a warm start.
	svc2, err := New(fx.svc.cfg, fx.rt, fx.rt, fx.rt, fx.svc.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.imageCheck = acceptImages
	init := createIn(t, svc2, fx.rt, sb.PodSandboxId, "init")
	if init.config.Command[0] != CompletedMountPath || !slices.ContainsFunc(init.config.Mounts, func(m *runtimeapi.Mount) bool {
		return m.ContainerPath == CompletedMountPath && m.HostPath == "/usr/bin/cri-shim" && m.Readonly
	}) {
		t.Errorf("completed init container not made a no-op: %v %v", init.config.Command, init.config.Mounts)
	}
	app := createIn(t, svc2, fx.rt, sb.PodSandboxId, "app")
	if stagedPages(t, svc2, app.status.Id) != archivePages(t, filepath.Join(later, layout.ArchiveName("app"))) || app.config.Image.Image != busybox {
		t.Errorf("app not restored: image %q", app.config.Image.Image)
	}
	again := createIn(t, svc2, fx.rt, sb.PodSandboxId, "app")
	if stagedPages(t, svc2, again.status.Id) != "" {
		t.Errorf("a restart of app was restored again")
	}
	other := createIn(t, svc2, fx.rt, "sb2", "app")
	if other.config.Image.Image != busybox || stagedPages(t, svc2, other.status.Id) != "" {
		t.Errorf("a container of another sandbox was rewritten")
	}
	if _, err := fx.rt.RemovePodSandbox(ctxT(t, time.Second), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if err := svc2.cfg.Store.Gone(sb.PodSandboxId); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, filepath.Join(fx.svc.cfg.StateDir, "checkpoint")); len(got) != 0 {
		t.Errorf("warm-start record left after RemovePodSandbox: %v", got)
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
	before := fx.rt.sandboxCount()
	_, err = fx.svc.RestorePod(ctxT(t, 5*time.Second), restoreReq(fx.dir, "app", "sidecar"))
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cgroup "+m.CgroupMode+" node") {
		t.Fatalf("got %v, want FailedPrecondition naming the checkpoint's cgroup mode", err)
	}
	if fx.rt.sandboxCount() != before {
		t.Fatal("the refused restore created a sandbox")
	}
}

// The kubelet's configs in RestorePod, with fields this build does not know
// (a newer kubelet's), reach the runtime whole: the sandbox's in
// RunPodSandbox, each container's in its CreateContainer (restoredConfig
// adds to a copy).
func TestRestorePodKeepsFieldsThisBuildDoesNotKnow(t *testing.T) {
	fx := checkpointed(t)
	req := restoreReq(fx.dir, "app", "sidecar")
	fakeruntime.AddUnknown(req.Config, "kubelet")
	for _, c := range req.ContainerConfigs {
		fakeruntime.AddUnknown(c, "kubelet")
		fakeruntime.AddUnknown(c.Metadata, "kubelet")
	}
	resp, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	runs := fx.rt.rt.Requests("RunPodSandbox")
	if r := runs[len(runs)-1].(*runtimeapi.RunPodSandboxRequest); !fakeruntime.HasUnknown(r.Config, "kubelet") {
		t.Errorf("the restored sandbox's config reached the runtime without the kubelet's unknown field")
	}
	cs := fx.rt.containersIn(t, resp.PodSandboxId)
	if len(cs) != 2 {
		t.Fatalf("%d containers restored", len(cs))
	}
	for _, c := range cs {
		if !fakeruntime.HasUnknown(c.config, "kubelet") || !fakeruntime.HasUnknown(c.config.Metadata, "kubelet") {
			t.Errorf("%s: its config reached the runtime without the kubelet's unknown fields", c.config.Metadata.Name)
		}
		if c.config.Annotations[RestoringAnnotation] != "true" {
			t.Errorf("%s: not created as a restore (annotations %v)", c.config.Metadata.Name, c.config.Annotations)
		}
	}
}
