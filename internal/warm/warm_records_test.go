package warm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// listingRT adds ListPodSandbox to the fake runtime; onList runs after the
// answer is made, before it is returned (a sandbox created meanwhile).
type listingRT struct {
	*ckpttest.Runtime
	onList  func()
	listErr error
}

func (l *listingRT) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	if l.listErr != nil {
		return nil, l.listErr
	}
	out, err := l.Runtime.ListPodSandbox(ctx, req, opts...)
	if err != nil {
		return nil, err
	}
	if l.onList != nil {
		l.onList()
	}
	return out, nil
}

func warmFiles(t *testing.T, svc *Service) int {
	t.Helper()
	return len(ckpttest.Entries(t, svc.warmRecs.Dir()))
}

func warmRecords(svc *Service) int {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return len(svc.warm)
}

// Warm-start records do not outlive their sandboxes: removed through the
// shim (also when the runtime answers NotFound), removed while the shim was
// down, or removed straight on the runtime, every record and file goes, and
// the count returns to zero.
func TestWarmRecordsReturnToZero(t *testing.T) {
	fx := newFixture(t)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	rt := &listingRT{Runtime: fx.rt}
	svc, err := New(fx.svc.cfg, rt, fx.restore, fx.ckpts, fx.log)
	if err != nil {
		t.Fatal(err)
	}
	svc.cfg.Store.Subscribe(svc.SandboxGone)
	ann := map[string]string{podspec.RestoreFromKey: filepath.Base(fx.dir)}
	const n = 60
	var ids []string
	for i := 0; i < n; i++ {
		sb, err := runSandboxIn(t, svc, fx.rt, "ns", ann)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.PodSandboxId)
	}
	if warmRecords(svc) != n || warmFiles(t, svc) != n {
		t.Fatalf("%d records, %d files after %d warm starts", warmRecords(svc), warmFiles(t, svc), n)
	}
	remove := func(svc *Service, id string, answer error) {
		t.Helper()
		// The state store's RemovePodSandbox hook announces the sandbox gone
		// when the runtime removed it or no longer knows it.
		if answer == nil {
			if _, err := fx.rt.RemovePodSandbox(ckpttest.CtxT(t, time.Second), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Fatal(err)
			}
		}
		if answer != nil && status.Code(answer) != codes.NotFound {
			return
		}
		if err := svc.cfg.Store.Gone(id); err != nil {
			t.Fatal(err)
		}
	}
	// Through the shim: 20 removed, 10 the runtime no longer knows.
	for _, id := range ids[:20] {
		remove(svc, id, nil)
	}
	for _, id := range ids[20:30] {
		fx.rt.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
		remove(svc, id, status.Error(codes.NotFound, "sandbox not found"))
	}
	// A removal the runtime refuses keeps the record: the sandbox is still there.
	remove(svc, ids[30], status.Error(codes.Unavailable, "containerd restarting"))
	if got := warmRecords(svc); got != n-30 {
		t.Fatalf("%d records after 30 removals, want %d", got, n-30)
	}

	// The shim is down while 20 more go; the pod table of a new one relists
	// at start (internal/podtable). A relist whose list fails removes nothing.
	for _, id := range ids[30:50] {
		fx.rt.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	}
	svc2, err := New(fx.svc.cfg, rt, fx.restore, fx.ckpts, fx.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.cfg.Store.Subscribe(svc2.SandboxGone)
	if got := warmRecords(svc2); got != n-30 {
		t.Fatalf("restarted shim loaded %d records, want %d", got, n-30)
	}
	table := podtable.New(rt, svc2.cfg.Store, svc2.log)
	rt.listErr = status.Error(codes.Unavailable, "down")
	if err := table.Sync(ckpttest.CtxT(t, time.Second)); err == nil || warmRecords(svc2) != n-30 {
		t.Fatalf("sweep with the runtime down: %v, %d records", err, warmRecords(svc2))
	}
	rt.listErr = nil
	// A warm start that begins while the sweep lists sandboxes keeps its record.
	var late string
	rt.onList = func() {
		rt.onList = nil
		sb, err := runSandboxIn(t, svc2, fx.rt, "ns", ann)
		if err != nil {
			t.Error(err)
			return
		}
		late = sb.PodSandboxId
		// Not in the answer already made, either way.
		if _, err := fx.rt.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: late}); err != nil {
			t.Error(err)
		}
	}
	if err := table.Sync(ckpttest.CtxT(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if svc2.warm[late] == nil {
		t.Fatal("the relist removed the record of a warm start that began during it")
	}
	if got, files := warmRecords(svc2), warmFiles(t, svc2); got != 11 || files != 11 {
		t.Fatalf("after the relist: %d records, %d files; want the 10 live sandboxes and the late one", got, files)
	}

	// The rest are removed behind the shim's back; the next relist finds them.
	for _, id := range append(ids[50:], ids[30], late) {
		fx.rt.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	}
	if err := table.Sync(ckpttest.CtxT(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, files := warmRecords(svc2), warmFiles(t, svc2); got != 0 || files != 0 {
		t.Fatalf("%d records and %d files left after every sandbox went", got, files)
	}
	if left := ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint")); len(left) != 0 {
		t.Fatalf("state files left: %v", left)
	}
}

// A warm-start step whose record cannot be made durable is not carried out:
// the sandbox (or the restored container) just created is removed again and
// the call answers Unavailable, so the kubelet retries; once the state can be
// written the retry warm-starts.
func TestWarmStartNotRecordedIsNotActedOn(t *testing.T) {
	fx := checkpointed(t)
	ann := map[string]string{podspec.RestoreFromKey: filepath.Base(fx.dir)}
	state := fx.svc.warmRecs.Dir()
	broken := func(on bool) { // the records' directory replaced by a file: every write fails
		t.Helper()
		if on {
			if err := os.Rename(state, state+".away"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(state, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return
		}
		os.Remove(state)
		if err := os.Rename(state+".away", state); err != nil {
			t.Fatal(err)
		}
	}
	sandboxes := fx.rt.SandboxCount
	n := sandboxes()
	broken(true)
	if _, err := runSandboxIn(t, fx.svc, fx.rt, "ns", ann); status.Code(proxy.Status(err)) != codes.Unavailable || !strings.Contains(err.Error(), "kubelet retries") {
		t.Fatalf("RunPodSandbox with the record not written: %v, want Unavailable", err)
	}
	if sandboxes() != n || warmRecords(fx.svc) != 0 {
		t.Fatalf("the sandbox of an unrecorded warm start was kept: %d sandboxes (want %d), %d records", sandboxes(), n, warmRecords(fx.svc))
	}
	broken(false)
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", ann)
	if err != nil {
		t.Fatal(err)
	}
	broken(true)
	create := func() (*runtimeapi.CreateContainerResponse, error) {
		return fx.svc.CreateContainer(ckpttest.CtxT(t, 5*time.Second), fx.rt.CreateReq(t, sb.PodSandboxId, "app"),
			func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				return fx.rt.CreateContainer(ctx, r)
			})
	}
	if _, err := create(); status.Code(proxy.Status(err)) != codes.Unavailable {
		t.Fatalf("CreateContainer with the record not written: %v, want Unavailable", err)
	}
	if c := fx.rt.ContainersIn(t, sb.PodSandboxId); len(c) != 0 {
		t.Fatalf("the restored container of an unrecorded step was kept: %d", len(c))
	}
	broken(false)
	resp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	if ckpttest.StagedPages(t, fx.rt.Marks, resp.ContainerId) != ckpttest.ArchivePages(t, filepath.Join(fx.dir, layout.ArchiveName("app"))) {
		t.Fatal("the kubelet's retry was not restored")
	}
}

// A sandbox the state store announces gone loses its warm start: record and
// file.
func TestGoneSandboxLosesItsWarmStart(t *testing.T) {
	fx := checkpointed(t)
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: filepath.Base(fx.dir)})
	if err != nil {
		t.Fatal(err)
	}
	if warmRecords(fx.svc) != 1 || warmFiles(t, fx.svc) != 1 {
		t.Fatal("no warm start recorded")
	}
	if err := fx.svc.cfg.Store.Gone(sb.PodSandboxId); err != nil {
		t.Fatal(err)
	}
	if warmRecords(fx.svc) != 0 || warmFiles(t, fx.svc) != 0 {
		t.Fatalf("after Gone: %d records, %d files", warmRecords(fx.svc), warmFiles(t, fx.svc))
	}
}
