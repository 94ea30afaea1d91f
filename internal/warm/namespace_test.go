package warm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// runSandboxIn is runSandbox for a pod of namespace ns.
func runSandboxIn(t *testing.T, svc *Service, rt *ckpttest.Runtime, ns string, ann map[string]string) (*runtimeapi.RunPodSandboxResponse, error) {
	t.Helper()
	req := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "warm", Namespace: ns, Uid: rt.UID("u-" + ns)}, Annotations: ann}}
	return admit(svc, rt).Run(ckpttest.CtxT(t, 5*time.Second), req, func(ctx context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
		return rt.RunPodSandbox(ctx, r)
	})
}

// allowing makes the restore service's allow-list exactly the given
// from->to pairs.
func allowing(fx *fixture, pairs ...[2]string) {
	fx.allow = func(from, to string) bool {
		for _, p := range pairs {
			if p[0] == from && p[1] == to {
				return true
			}
		}
		return false
	}
}

// secretsOf are strings a refusal must not contain when it is about a
// checkpoint of another namespace: its pod, namespace, uid, path, containers
// and images (the fixture's checkpoint is of pod1 in namespace "ns").
func leaks(msg string, fx *fixture) []string {
	var out []string
	for _, s := range []string{"pod1", `"ns"`, "ns/", "uid-sb1", "sb1", fx.dir, "app", "sidecar", "init", "busybox", "sha256", "kata", "handler"} {
		if strings.Contains(msg, s) {
			out = append(out, s)
		}
	}
	return out
}

// RestorePod of a checkpoint of namespace "ns" into a sandbox of another
// namespace is refused before anything is created, with the answer a missing
// checkpoint gets, and nothing of the checkpoint in it; the allow-list opens
// exactly the listed direction.
func TestRestorePodNamespaceBinding(t *testing.T) {
	fx := checkpointed(t)
	in := func(ns string, r *runtimeapi.RestorePodRequest) *runtimeapi.RestorePodRequest {
		r.Config.Metadata.Namespace = ns
		return r
	}
	foreign := in("other", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	_, err := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), foreign)
	if status.Code(proxy.Status(err)) != codes.NotFound || !strings.Contains(err.Error(), "own namespace") || !strings.Contains(err.Error(), "restore_namespace_allow") {
		t.Fatalf("foreign checkpoint: %v, want NotFound naming the rule", err)
	}
	if l := leaks(status.Convert(proxy.Status(err)).Message(), fx); len(l) > 0 {
		t.Errorf("the refusal tells %v about the checkpoint: %v", l, err)
	}
	_, missing := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), in("other", ckpttest.RestoreReq(filepath.Join(fx.root, "gone"), "app", "sidecar")))
	if err.Error() != missing.Error() {
		t.Errorf("a foreign checkpoint and a missing one are told apart:\n%v\n%v", err, missing)
	}
	// What would be reported in the checkpoint's own namespace is not
	// reported to another: a wrong image, a wrong handler, wrong names.
	wrongImage := in("other", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	wrongImage.ContainerConfigs[0].Image.Image = "docker.io/library/nginx:latest"
	handler := in("other", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	handler.RuntimeHandler = "kata"
	for _, r := range []*runtimeapi.RestorePodRequest{wrongImage, handler, in("other", ckpttest.RestoreReq(fx.dir, "app"))} {
		if _, e := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), r); e == nil || e.Error() != err.Error() {
			t.Errorf("refusal %v, want the same as for any foreign checkpoint", e)
		}
	}
	// A pod without a namespace is not in "ns" either.
	if _, e := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), in("", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))); status.Code(proxy.Status(e)) != codes.NotFound {
		t.Errorf("pod without a namespace: %v", e)
	}
	if fx.rt.SandboxCount() != 2 {
		t.Fatalf("a refused restore created a sandbox: %d sandboxes", fx.rt.SandboxCount())
	}

	// The reverse pair does not open this direction; the pair does.
	allowing(fx, [2]string{"other", "ns"})
	if _, e := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), in("other", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))); status.Code(proxy.Status(e)) != codes.NotFound {
		t.Errorf("reverse pair allowed the restore: %v", e)
	}
	allowing(fx, [2]string{"ns", "other"})
	if _, e := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), in("other", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))); e != nil {
		t.Fatalf("allowed pair: %v", e)
	}
	// Once allowed, details are reported.
	wrongImage = in("other", ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	wrongImage.ContainerConfigs[0].Image.Image = "docker.io/library/nginx:latest"
	if _, e := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), wrongImage); status.Code(proxy.Status(e)) != codes.InvalidArgument || !strings.Contains(e.Error(), "busybox") {
		t.Errorf("allowed pair, wrong image: %v", e)
	}
	// The same namespace needs no pair.
	if _, e := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar")); e != nil {
		t.Fatalf("same namespace: %v", e)
	}
}

// A warm start names a checkpoint by its directory name, which is guessable:
// a pod of another namespace is refused before its sandbox exists, with the
// answer a missing checkpoint gets; its containers are never restored.
func TestWarmStartNamespaceBinding(t *testing.T) {
	fx := newFixture(t)
	cp := filepath.Join(fx.root, "ns-pod1-20260101T000000Z")
	os.Mkdir(cp, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(cp, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(cp)
	_, err := runSandboxIn(t, fx.svc, fx.rt, "evil", map[string]string{podspec.RestoreFromKey: name})
	if status.Code(proxy.Status(err)) != codes.NotFound || !strings.Contains(err.Error(), "own namespace") || !strings.Contains(err.Error(), "kubelet retries") {
		t.Fatalf("foreign warm start: %v, want NotFound naming the rule", err)
	}
	msg := strings.ReplaceAll(status.Convert(proxy.Status(err)).Message(), name, "NAME")
	if l := leaks(msg, fx); len(l) > 0 {
		t.Errorf("the refusal tells %v about the checkpoint: %v", l, err)
	}
	_, missing := runSandboxIn(t, fx.svc, fx.rt, "evil", map[string]string{podspec.RestoreFromKey: "ns-pod1-20260101T000001Z"})
	if msg != strings.ReplaceAll(status.Convert(proxy.Status(missing)).Message(), "ns-pod1-20260101T000001Z", "NAME") || status.Code(proxy.Status(missing)) != status.Code(proxy.Status(err)) {
		t.Errorf("a foreign checkpoint and a missing one are told apart:\n%v\n%v", err, missing)
	}
	if fx.rt.SandboxCount() != 2 || len(fx.svc.warm) != 0 {
		t.Fatalf("a refused warm start created a sandbox or a record: %d sandboxes, %d records", fx.rt.SandboxCount(), len(fx.svc.warm))
	}

	// The same namespace warm-starts, and may be told what is wrong.
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: name})
	if err != nil {
		t.Fatal(err)
	}
	bad := ckpttest.CtrCfg("app")
	bad.Image.Image = "docker.io/library/nginx:latest"
	_, err = fx.svc.CreateContainer(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: bad, SandboxConfig: fx.rt.SandboxConfig(t, sb.PodSandboxId)},
		func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return fx.rt.CreateContainer(ctx, r)
		})
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "busybox") {
		t.Fatalf("same namespace, wrong image: %v", err)
	}
	if app := createIn(t, fx.svc, fx.rt, sb.PodSandboxId, "app"); ckpttest.StagedPages(t, fx.rt.Marks, app.Status.Id) != ckpttest.ArchivePages(t, filepath.Join(cp, layout.ArchiveName("app"))) {
		t.Fatalf("same namespace: app not restored (image %q)", app.Config.Image.Image)
	}

	// An allowed pair warm-starts; when the pair is taken out of the
	// configuration, a restarted shim drops the record, and a container the
	// kubelet creates then in that sandbox starts from its image.
	allowing(fx, [2]string{"ns", "guest"})
	sb, err = runSandboxIn(t, fx.svc, fx.rt, "guest", map[string]string{podspec.RestoreFromKey: name})
	if err != nil {
		t.Fatalf("allowed pair: %v", err)
	}
	fx.allow = nil
	svc2, err := New(fx.svc.cfg, fx.rt, fx.restore, fx.ckpts, fx.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.cfg.Store.Subscribe(svc2.SandboxGone)
	if svc2.warm[sb.PodSandboxId] != nil {
		t.Fatal("a restarted shim kept the warm start of a pair no longer allowed")
	}
	if app := createIn(t, svc2, fx.rt, sb.PodSandboxId, "app"); app.Config.Image.Image != "docker.io/library/busybox:latest" {
		t.Fatalf("pair no longer allowed: app restored from %q", app.Config.Image.Image)
	}
	// The record is checked at every use too, against the sandbox config
	// the kubelet sends: one of another namespace gets the rule, not the
	// checkpoint's image.
	allowing(fx, [2]string{"ns", "guest"})
	sb, err = runSandboxIn(t, svc2, fx.rt, "guest", map[string]string{podspec.RestoreFromKey: name})
	if err != nil {
		t.Fatal(err)
	}
	fx.allow = nil
	_, err = svc2.CreateContainer(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: bad,
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "guest"}}},
		func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			t.Fatal("a container was created")
			return nil, nil
		})
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "own namespace") {
		t.Fatalf("use of a record no longer allowed: %v", err)
	}
	if l := leaks(strings.NewReplacer(`container "app"`, "", name, "NAME").Replace(status.Convert(proxy.Status(err)).Message()), fx); len(l) > 0 {
		t.Errorf("the refusal tells %v about the checkpoint: %v", l, err)
	}
}
