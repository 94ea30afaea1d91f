package restore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckptarchive"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

func startC(svc *Service, rt *ckpttest.Runtime, id string) error {
	_, err := svc.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id},
		func(ctx context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
			return rt.StartContainer(ctx, r)
		})
	return err
}

// A restored container is created from the pod's own config, its restore
// staged from the archive; its start restores it (the runtime shim claims
// the mark), and the staging is gone afterwards.
func TestRestorePodStagesEachContainerAndItsStartRestoresIt(t *testing.T) {
	fx := checkpointed(t)
	resp, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	if !fx.svc.HookActive(proxy.StartContainer) {
		t.Fatal("the start of a staged container would not be seen")
	}
	for _, rc := range resp.RestoredContainers {
		want := ckpttest.ArchivePages(t, filepath.Join(fx.dir, layout.ArchiveName(rc.Name)))
		if got := ckpttest.StagedPages(t, fx.rt.Marks, rc.ContainerId); got != want {
			t.Fatalf("%s staged %q, want the archive's %q", rc.Name, got, want)
		}
		if err := startC(fx.svc, fx.rt, rc.ContainerId); err != nil {
			t.Fatal(err)
		}
		if got := fx.rt.Restored[rc.ContainerId]; got != want {
			t.Fatalf("%s started restoring %q, want %q", rc.Name, got, want)
		}
	}
	if fx.svc.HookActive(proxy.StartContainer) {
		t.Fatal("StartContainer still hooked with nothing staged")
	}
	if ents, _ := os.ReadDir(filepath.Join(fx.root, stagingDirName)); len(ents) != 0 {
		t.Fatalf("staging left: %v", ents)
	}
	if ents, _ := fx.rt.Marks.List(); len(ents) != 0 {
		t.Fatalf("marks left: %+v", ents)
	}
}

// On a node whose handler runs containerd's own runc shim the mark is never
// claimed: the container started fresh, so it is stopped and the start
// fails saying what the node lacks.
func TestStartWithoutTheRuntimeShimFails(t *testing.T) {
	fx := checkpointed(t)
	fx.rt.PlainShim = true
	resp, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.RestoredContainers[0].ContainerId
	err = startC(fx.svc, fx.rt, id)
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), restoremark.RuntimeShimName) {
		t.Fatalf("start without the runtime shim: %v", err)
	}
	if st := fx.rt.ContainerOf(t, id).Status.State; st != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("the container that started fresh is %s, want stopped", st)
	}
}

// A killed shim's staged restores are taken up: one whose container still
// waits for its start is kept (and restored by it), the rest removed.
func TestRecoverStaged(t *testing.T) {
	fx := checkpointed(t)
	resp, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	waiting, gone := resp.RestoredContainers[0].ContainerId, resp.RestoredContainers[1].ContainerId
	if _, err := fx.rt.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: gone}); err != nil {
		t.Fatal(err)
	}
	svc2 := New(fx.svc.cfg, fx.rt, fx.rt, fx.rt, fx.log)
	svc2.Recover(context.Background())
	if ckpttest.StagedPages(t, fx.rt.Marks, gone) != "" {
		t.Fatal("the restore of a removed container was kept")
	}
	if _, err := os.Stat(filepath.Join(filepath.Join(fx.root, stagingDirName), gone)); !os.IsNotExist(err) {
		t.Fatalf("staging of a removed container left: %v", err)
	}
	if err := startC(svc2, fx.rt, waiting); err != nil {
		t.Fatal(err)
	}
	if fx.rt.Restored[waiting] == "" {
		t.Fatal("the waiting container was not restored at its start")
	}
}

// What the restore takes of a good archive: the images and the diff, byte
// for byte; the log's place in the archive; nothing else.
func TestExtractForRestoreTakesImagesDiffAndLog(t *testing.T) {
	fx := checkpointed(t)
	archive := filepath.Join(fx.dir, layout.ArchiveName("app"))
	out := t.TempDir()
	files, err := ckptarchive.Extract(archive, out)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(files.Images, "pages-1.img")); string(b) != ckpttest.ArchivePages(t, archive) {
		t.Fatalf("pages %q", b)
	}
	if b, _ := os.ReadFile(files.Diff); string(b) != ckpttest.ArchiveEntry(t, archive, "rootfs-diff.tar") {
		t.Fatalf("diff %q", b)
	}
	ents, _ := os.ReadDir(out)
	if len(ents) != 2 {
		t.Fatalf("staged %v, want checkpoint/ and rootfs-diff.tar only", ents)
	}
}

// When containerd's configuration says the handler runs its own runc shim,
// RestorePod is refused before it creates anything.
func TestRestorePodRefusedWithoutTheRuntimeShim(t *testing.T) {
	fx := checkpointed(t)
	fx.rt.RT.Rewrite("Status", func(resp proto.Message) {
		r := resp.(*runtimeapi.StatusResponse)
		r.Info = map[string]string{"config": `{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2"}}}}`}
	})
	before := len(fx.rt.RT.Requests("RunPodSandbox"))
	_, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), restoremark.RuntimeShimName) {
		t.Fatalf("RestorePod without the runtime shim: %v", err)
	}
	if n := len(fx.rt.RT.Requests("RunPodSandbox")); n != before {
		t.Fatal("a sandbox was created for a restore that cannot work")
	}
	// With the runtime shim as the handler's runtime it goes on.
	fx.rt.RT.Rewrite("Status", func(resp proto.Message) {
		r := resp.(*runtimeapi.StatusResponse)
		r.Info = map[string]string{"config": `{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2","runtimePath":"/usr/local/bin/` + restoremark.RuntimeShimName + `"}}}}`}
	})
	if _, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar")); err != nil {
		t.Fatal(err)
	}
}

// A shim killed between the create of a restored container and its mark
// leaves a CREATED container that a start would run afresh: the next shim
// removes it; containers it creates itself, and others, are left alone.
func TestRecoverRemovesUnmarkedRestoredContainers(t *testing.T) {
	fx := checkpointed(t)
	resp, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	unmarked, marked := resp.RestoredContainers[0].ContainerId, resp.RestoredContainers[1].ContainerId
	if err := fx.rt.Marks.Remove(unmarked); err != nil { // as if killed before the mark
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	svc2 := New(fx.svc.cfg, fx.rt, fx.rt, fx.rt, fx.log)
	svc2.Recover(context.Background())
	if _, _, ok := fx.rt.RT.Container(unmarked); ok {
		t.Fatal("the unmarked restored container was left to start afresh")
	}
	if _, _, ok := fx.rt.RT.Container(marked); !ok {
		t.Fatal("the marked one was removed")
	}
	if _, _, ok := fx.rt.RT.Container("x1"); !ok {
		t.Fatal("a CREATED container not made for a restore was removed")
	}
	if err := startC(svc2, fx.rt, marked); err != nil || fx.rt.Restored[marked] == "" {
		t.Fatalf("the marked container was not restored at its start: %v", err)
	}
}
