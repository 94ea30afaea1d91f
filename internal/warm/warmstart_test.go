package warm

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

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// admit is the pod table's admission with the service alone.
func admit(svc *Service, rt *ckpttest.Runtime) podtable.Admissions {
	return podtable.Admissions{Features: []podtable.Admitter{svc}, RT: rt, Log: svc.log}
}

func runSandbox(t *testing.T, svc *Service, rt *ckpttest.Runtime, ann map[string]string) (*runtimeapi.RunPodSandboxResponse, error) {
	t.Helper()
	req := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "warm", Namespace: "ns", Uid: rt.UID("u2")}, Annotations: ann}}
	return admit(svc, rt).Run(ckpttest.CtxT(t, 5*time.Second), req, func(ctx context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
		return rt.RunPodSandbox(ctx, r)
	})
}

func createIn(t *testing.T, svc *Service, rt *ckpttest.Runtime, sandbox, name string) *ckpttest.Ctr {
	t.Helper()
	resp, err := svc.CreateContainer(ckpttest.CtxT(t, 5*time.Second), rt.CreateReq(t, sandbox, name),
		func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return rt.CreateContainer(ctx, r)
		})
	if err != nil {
		t.Fatal(err)
	}
	return rt.ContainerOf(t, resp.ContainerId)
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
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(later, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	sb, err := runSandbox(t, fx.svc, fx.rt, ann)
	if err != nil {
		t.Fatal(err)
	}
	// A restarted shim still knows the sandbox is a warm start.
	svc2, err := New(fx.svc.cfg, fx.rt, fx.restore, fx.ckpts, fx.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.cfg.Store.Subscribe(svc2.SandboxGone)
	init := createIn(t, svc2, fx.rt, sb.PodSandboxId, "init")
	if init.Config.Command[0] != CompletedMountPath || !slices.ContainsFunc(init.Config.Mounts, func(m *runtimeapi.Mount) bool {
		return m.ContainerPath == CompletedMountPath && m.HostPath == "/usr/bin/cri-shim" && m.Readonly
	}) {
		t.Errorf("completed init container not made a no-op: %v %v", init.Config.Command, init.Config.Mounts)
	}
	app := createIn(t, svc2, fx.rt, sb.PodSandboxId, "app")
	if ckpttest.StagedPages(t, fx.rt.Marks, app.Status.Id) != ckpttest.ArchivePages(t, filepath.Join(later, layout.ArchiveName("app"))) || app.Config.Image.Image != ckpttest.Busybox {
		t.Errorf("app not restored: image %q", app.Config.Image.Image)
	}
	again := createIn(t, svc2, fx.rt, sb.PodSandboxId, "app")
	if ckpttest.StagedPages(t, fx.rt.Marks, again.Status.Id) != "" {
		t.Errorf("a restart of app was restored again")
	}
	other := createIn(t, svc2, fx.rt, "sb2", "app")
	if other.Config.Image.Image != ckpttest.Busybox || ckpttest.StagedPages(t, fx.rt.Marks, other.Status.Id) != "" {
		t.Errorf("a container of another sandbox was rewritten")
	}
	if _, err := fx.rt.RemovePodSandbox(ckpttest.CtxT(t, time.Second), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if err := svc2.cfg.Store.Gone(sb.PodSandboxId); err != nil {
		t.Fatal(err)
	}
	if got := ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint")); len(got) != 0 {
		t.Errorf("warm-start record left after RemovePodSandbox: %v", got)
	}
}
