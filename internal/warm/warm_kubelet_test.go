package warm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// kubeletCreate is the kubelet's CreateContainer of container app, attempt
// n, in sandbox sb, through the service's hook; it returns the created
// container's image.
func kubeletCreate(t *testing.T, fx *fixture, sb string, attempt uint32) (string, string) {
	t.Helper()
	cfg := ckpttest.CtrCfg("app")
	cfg.Metadata.Attempt = attempt
	req := &runtimeapi.CreateContainerRequest{PodSandboxId: sb, SandboxConfig: fx.rt.SandboxConfig(t, sb), Config: cfg}
	resp, err := fx.svc.CreateContainer(ckpttest.CtxT(t, 5*time.Second), req, func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		return fx.rt.CreateContainer(ctx, r)
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetContainerId(), ckpttest.StagedPages(t, fx.rt.Marks, resp.GetContainerId())
}

// warmRestartPod adds sandbox id of a pod asking for warm restarts, its
// container app (c-<id>) checkpointed into <id>-cp and then removed (its
// name and attempt 0 are free again); it returns the checkpoint's archive
// of app.
func warmRestartPod(t *testing.T, fx *fixture, id string) string {
	t.Helper()
	ckpttest.AddPod(t, fx.rt, fx.table, id, map[string]string{podspec.WarmRestartKey: "true"}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	fx.svc.Adopt()
	dir := filepath.Join(fx.root, id+"-cp")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: id, OutputPath: dir, ContainerIds: []string{"c-" + id}}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.rt.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: "c-" + id}); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, layout.ArchiveName("app"))
}

// A pod asking for warm restarts whose container the kubelet restarts
// (attempt above 0) gets the container restored from its checkpoint; a
// first start (attempt 0) is cold. A restore that fails at start makes the
// next create cold, and the one after warm again.
func TestKubeletRestartIsWarm(t *testing.T) {
	fx := newFixture(t)
	archive := ckpttest.ArchivePages(t, warmRestartPod(t, fx, "sw"))
	if !fx.svc.HookActive(proxy.CreateContainer) || fx.svc.HookActive(proxy.StartContainer) {
		t.Fatal("hooks: CreateContainer must be active for a warm-restart pod, StartContainer not yet")
	}
	if _, img := kubeletCreate(t, fx, "sw", 0); img == archive {
		t.Fatal("a first start (attempt 0) was restored")
	}
	id, img := kubeletCreate(t, fx, "sw", 1)
	if img != archive {
		t.Fatalf("the kubelet's restart created from %q, want the checkpoint's archive", img)
	}
	if !fx.svc.HookActive(proxy.StartContainer) || len(fx.ckpts.inUse()) != 1 {
		t.Fatal("the restore's start is not awaited, or the checkpoint not held")
	}
	// The restore fails at start: the error reaches the kubelet, the next
	// create is cold, the one after warm again.
	failStart := func(context.Context, *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
		return nil, errors.New("criu restore failed")
	}
	if err := fx.startWith(id, failStart); err == nil || !strings.Contains(err.Error(), "criu restore failed") {
		t.Fatalf("start error %v not passed on", err)
	}
	if len(fx.ckpts.inUse()) != 0 {
		t.Fatal("a failed restore still holds its checkpoint")
	}
	if _, img := kubeletCreate(t, fx, "sw", 2); img == archive {
		t.Fatal("the create after a failed restore was restored again")
	}
	if _, img := kubeletCreate(t, fx, "sw", 3); img != archive {
		t.Fatal("the next restart after the cold one was not warm")
	}
	fx.svc.SandboxGone("sw")
	if fx.svc.HookActive(proxy.CreateContainer) || fx.svc.HookActive(proxy.StartContainer) || len(fx.ckpts.inUse()) != 0 {
		t.Fatal("a removed sandbox's warm restarts are still kept")
	}
}

// Without a checkpoint the kubelet's restart is created cold.
func TestKubeletRestartWithoutCheckpointIsCold(t *testing.T) {
	fx := newFixture(t)
	ckpttest.AddPod(t, fx.rt, fx.table, "sw", map[string]string{podspec.WarmRestartKey: "true"}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	fx.svc.Adopt()
	if _, img := kubeletCreate(t, fx, "sw", 1); img != "" {
		t.Fatalf("restore staged from %q without a checkpoint", img)
	}
	if fx.svc.HookActive(proxy.StartContainer) || fx.restore.HookActive(proxy.StartContainer) {
		t.Fatal("a cold create is awaited at start")
	}
}
