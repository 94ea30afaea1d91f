package warm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// warmReq is the replay's cold create of container name of the checkpointed
// pod (cp1's UID and namespace), with the pod's annotations.
func warmReq(t *testing.T, fx *fixture, name string, ann map[string]string) *runtimeapi.CreateContainerRequest {
	t.Helper()
	m, err := layout.ReadManifest(fx.dir)
	if err != nil {
		t.Fatal(err)
	}
	return &runtimeapi.CreateContainerRequest{PodSandboxId: m.Pod.SandboxID, Config: ckpttest.CtrCfg(name),
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: m.Pod.Name, Namespace: m.Pod.Namespace, Uid: m.Pod.UID},
			Annotations: ann}}
}

var warmOn = map[string]string{podspec.WarmRestartKey: "true"}

// checkpointAgain takes another checkpoint of the fixture's pod into name.
func checkpointAgain(t *testing.T, fx *fixture, name string) string {
	t.Helper()
	d := filepath.Join(fx.root, name)
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(d, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	return d
}

// The pod's newest checkpoint restores the container: the request's image is
// that checkpoint's archive, the rest is the cold request's; retention leaves
// the checkpoint alone until the restore is released.
func TestWarmRestartRestoresFromThePodsNewestCheckpoint(t *testing.T) {
	fx := checkpointed(t)
	time.Sleep(2 * time.Millisecond)
	newer := checkpointAgain(t, fx, "cp2")
	req := warmReq(t, fx, "app", warmOn)
	w, err := fx.svc.WarmRestartRequest(ckpttest.CtxT(t, 5*time.Second), req)
	if err != nil || w == nil {
		t.Fatalf("got %+v, %v", w, err)
	}
	if w.Checkpoint != "cp2" || w.Request.Config.Image.Image != ckpttest.Busybox || w.Created == nil {
		t.Fatalf("restores from %s (image %q), want the newest, cp2, from the pod's own image", w.Checkpoint, w.Request.Config.Image.Image)
	}
	created := proto.Clone(w.Request).(*runtimeapi.CreateContainerRequest)
	created.Config.Metadata.Attempt = 1 // as a restart; attempt 0 is the running instance
	cr, err := fx.rt.CreateContainer(ckpttest.CtxT(t, 5*time.Second), created)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Created(cr.ContainerId); err != nil {
		t.Fatal(err)
	}
	if ckpttest.StagedPages(t, fx.rt.Marks, cr.ContainerId) != ckpttest.ArchivePages(t, filepath.Join(newer, layout.ArchiveName("app"))) {
		t.Fatal("the restore was not staged from cp2's archive")
	}
	if req.Config.Image.Image != "docker.io/library/busybox:latest" {
		t.Fatal("the cold request was changed")
	}
	fx.svc.mu.Lock()
	inUse := fx.ckpts.inUse()[newer]
	fx.svc.mu.Unlock()
	if inUse != 1 {
		t.Fatalf("checkpoint not marked in use by the restore: %d", inUse)
	}
	w.Release()
	w.Release()
	if len(fx.ckpts.inUse()) != 0 {
		t.Fatalf("released twice, still in use: %v", fx.ckpts.inUse())
	}
}

// A container that had completed before the checkpoint (an init container)
// runs as a no-op; one the checkpoint does not have starts fresh (nil).
func TestWarmRestartOfContainersNotCaptured(t *testing.T) {
	fx := checkpointed(t)
	w, err := fx.svc.WarmRestartRequest(ckpttest.CtxT(t, 5*time.Second), warmReq(t, fx, "init", warmOn))
	if err != nil || w == nil || w.Request.Config.Command[0] != CompletedMountPath {
		t.Fatalf("completed init container: %+v, %v", w, err)
	}
	w.Release()
	if w, err := fx.svc.WarmRestartRequest(ckpttest.CtxT(t, 5*time.Second), warmReq(t, fx, "added-later", warmOn)); w != nil || err != nil {
		t.Fatalf("container not in the checkpoint: %+v, %v", w, err)
	}
}

// Without the annotation nothing is restored; with it and no usable
// checkpoint the error says why.
func TestWarmRestartRefusals(t *testing.T) {
	fx := checkpointed(t)
	ctx := ckpttest.CtxT(t, 5*time.Second)
	for _, ann := range []map[string]string{nil, {podspec.WarmRestartKey: "false"}} {
		if w, err := fx.svc.WarmRestartRequest(ctx, warmReq(t, fx, "app", ann)); w != nil || err != nil {
			t.Errorf("annotations %v: %+v, %v; want nothing", ann, w, err)
		}
	}
	otherPod := warmReq(t, fx, "app", warmOn)
	otherPod.SandboxConfig.Metadata.Uid = "someone-else"
	otherNS := warmReq(t, fx, "app", warmOn)
	otherNS.SandboxConfig.Metadata.Namespace = "elsewhere"
	wrongImage := warmReq(t, fx, "app", warmOn)
	wrongImage.Config.Image.Image = "docker.io/library/nginx:latest"
	cases := []struct {
		name string
		req  *runtimeapi.CreateContainerRequest
		want string
	}{
		{"another pod's checkpoint", otherPod, "has no checkpoint"},
		{"same UID, another namespace", otherNS, "has no checkpoint"},
		{"another image", wrongImage, "is not the checkpointed image"},
		{"bad value", warmReq(t, fx, "app", map[string]string{podspec.WarmRestartKey: "yes"}), podspec.WarmRestartKey},
		{"bad age", warmReq(t, fx, "app", map[string]string{podspec.WarmRestartKey: "true", podspec.WarmRestartMaxAgeKey: "-1s"}), podspec.WarmRestartMaxAgeKey},
	}
	for _, c := range cases {
		w, err := fx.svc.WarmRestartRequest(ctx, c.req)
		if w != nil || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %+v, %v; want an error with %q", c.name, w, err, c.want)
		}
	}
	fx.svc.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	w, err := fx.svc.WarmRestartRequest(ctx, warmReq(t, fx, "app", warmOn))
	if w != nil || !errors.Is(err, errNoWarmCheckpoint) || !strings.Contains(err.Error(), "old, more than 1h0m0s") {
		t.Fatalf("stale checkpoint: %+v, %v", w, err)
	}
	w, err = fx.svc.WarmRestartRequest(ctx, warmReq(t, fx, "app", map[string]string{podspec.WarmRestartKey: "true", podspec.WarmRestartMaxAgeKey: "3h"}))
	if w == nil || err != nil {
		t.Fatalf("layout.Within a 3h maximum age: %+v, %v", w, err)
	}
	w.Release()
	if len(fx.ckpts.inUse()) != 0 {
		t.Fatal("a refused request left a checkpoint marked in use")
	}
}

// The newest checkpoint cannot restore the container (its archive is gone):
// an older good one of the same pod does.
func TestWarmRestartSkipsAnUnusableNewestCheckpoint(t *testing.T) {
	fx := checkpointed(t)
	time.Sleep(2 * time.Millisecond)
	newer := checkpointAgain(t, fx, "cp2")
	if err := os.Remove(filepath.Join(newer, layout.ArchiveName("app"))); err != nil {
		t.Fatal(err)
	}
	w, err := fx.svc.WarmRestartRequest(ckpttest.CtxT(t, 5*time.Second), warmReq(t, fx, "app", warmOn))
	if err != nil || w == nil || w.Checkpoint != "cp1" {
		t.Fatalf("got %+v, %v; want cp1", w, err)
	}
	w.Release()
}
