package runtimeshim

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/regfile"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// inner stands for the runc shim's task service: it records what it was
// asked and, like the runc shim, has mounted the rootfs once Create returns.
type inner struct {
	taskAPI.TTRPCTaskService
	creates []*taskAPI.CreateTaskRequest
	deletes []string
	starts  []string
}

func (f *inner) Create(_ context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	f.creates = append(f.creates, r)
	if err := os.MkdirAll(filepath.Join(r.Bundle, "rootfs"), 0o755); err != nil {
		return nil, err
	}
	return &taskAPI.CreateTaskResponse{Pid: 0}, nil
}

func (f *inner) Start(_ context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	f.starts = append(f.starts, r.ID)
	return &taskAPI.StartResponse{}, nil
}

func (f *inner) Delete(_ context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	f.deletes = append(f.deletes, r.ID)
	return &taskAPI.DeleteResponse{}, nil
}

type fixture struct {
	svc    *Service
	inner  *inner
	marks  restoremark.Dir
	images string
	bundle string
	// checkpoint is what fx.images holds.
	checkpoint *criutest.Images
}

func newFixture(t *testing.T) *fixture {
	root := t.TempDir()
	fx := &fixture{inner: &inner{}, marks: restoremark.Dir{Path: filepath.Join(root, "marks"), Owner: os.Getuid()},
		images: filepath.Join(root, "images"), bundle: filepath.Join(root, "bundle")}
	for _, d := range []string{fx.images, fx.bundle} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The bundle's spec and the staged images are a container's and a
	// checkpoint it allows (criutest); refused images are tested below.
	spec := criutest.DefaultSpec()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	fx.checkpoint = criutest.ForSpec(spec)
	if err := fx.checkpoint.Write(fx.images); err != nil {
		t.Fatal(err)
	}
	fx.svc = New(fx.inner, fx.marks)
	return fx
}

func (fx *fixture) request() *taskAPI.CreateTaskRequest {
	return &taskAPI.CreateTaskRequest{ID: id, Bundle: fx.bundle, Rootfs: []*types.Mount{{Type: "overlay", Source: "overlay"}}}
}

// layer writes a layer tar with the given files and a whiteout of gone,
// owned by the test's user (the applier gives each file its owner).
func layer(t *testing.T, path string, files map[string]string, gone string) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	uid, gid := os.Getuid(), os.Getgid()
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, Uid: uid, Gid: gid}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	if gone != "" {
		tw.WriteHeader(&tar.Header{Name: filepath.Join(filepath.Dir(gone), ".wh."+filepath.Base(gone)), Mode: 0o644, Typeflag: tar.TypeReg, Uid: uid, Gid: gid})
	}
	tw.Close()
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestUnmarkedTaskIsCreatedAsIs(t *testing.T) {
	fx := newFixture(t)
	if _, err := fx.svc.Create(context.Background(), fx.request()); err != nil {
		t.Fatal(err)
	}
	if len(fx.inner.creates) != 1 || fx.inner.creates[0].Checkpoint != "" {
		t.Fatalf("creates: %+v", fx.inner.creates)
	}
}

func TestMarkedTaskIsCreatedAsARestore(t *testing.T) {
	fx := newFixture(t)
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	layer(t, diff, map[string]string{"data/new": "after the checkpoint"}, "etc/gone")
	if err := os.MkdirAll(filepath.Join(fx.bundle, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.bundle, "rootfs", "etc", "gone"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err != nil {
		t.Fatal(err)
	}
	if len(fx.inner.creates) != 1 || fx.inner.creates[0].Checkpoint != fx.images {
		t.Fatalf("the task was not created as a restore from %s: %+v", fx.images, fx.inner.creates)
	}
	if b, err := os.ReadFile(filepath.Join(fx.bundle, "rootfs", "data", "new")); err != nil || string(b) != "after the checkpoint" {
		t.Fatalf("rootfs change not applied: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(fx.bundle, "rootfs", "etc", "gone")); !os.IsNotExist(err) {
		t.Fatalf("whiteout not applied: %v", err)
	}
	if !fx.marks.Claimed(id) {
		t.Fatal("mark not claimed")
	}
	// A second task of the same container (containerd never makes one,
	// but a mark is used once) is created as is.
	if _, err := fx.svc.Create(context.Background(), fx.request()); err != nil || fx.inner.creates[1].Checkpoint != "" {
		t.Fatalf("mark used twice: %v %+v", err, fx.inner.creates)
	}
}

// The diff is applied with containerd's layer applier: a symlink may point
// anywhere, and an entry written through it stays inside the rootfs; a name
// that climbs out is refused before anything is applied.
func TestRootfsDiffStaysInsideTheRootfs(t *testing.T) {
	fx := newFixture(t)
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../../..", Uid: os.Getuid(), Gid: os.Getgid()})
	tw.WriteHeader(&tar.Header{Name: "up/escaped", Typeflag: tar.TypeReg, Mode: 0o644, Uid: os.Getuid(), Gid: os.Getgid()})
	tw.Close()
	if err := os.WriteFile(diff, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.svc.Create(context.Background(), fx.request())
	for _, p := range []string{filepath.Join(fx.bundle, "escaped"), filepath.Join(filepath.Dir(fx.bundle), "escaped")} {
		if _, serr := os.Stat(p); serr == nil {
			t.Fatalf("a diff entry was written outside the rootfs at %s (create: %v)", p, err)
		}
	}
	if _, serr := os.Stat(filepath.Join(fx.bundle, "rootfs", "escaped")); err != nil || serr != nil {
		t.Fatalf("the entry below the symlink was not applied inside the rootfs: %v, %v", err, serr)
	}

	fx = newFixture(t)
	layer(t, diff, map[string]string{"../../escaped": "x"}, "")
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err == nil || !strings.Contains(err.Error(), "../../escaped name") || len(fx.inner.creates) != 0 {
		t.Fatalf("a name out of the rootfs: %v, %d tasks created", err, len(fx.inner.creates))
	}
}

// A setuid-root binary in the diff (issue 41: a pod of user 1000 ran one
// with euid 0) is refused before any task exists or any entry is applied:
// the rootfs is as it was, and the refusal is left for cri-shim.
func TestSetuidDiffIsRefusedBeforeAnythingIsApplied(t *testing.T) {
	fx := newFixture(t)
	rootfs := filepath.Join(fx.bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	setuidLayer(t, diff)
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.svc.Create(context.Background(), fx.request())
	if err == nil || !strings.Contains(err.Error(), "checkpoint refused") || !strings.Contains(err.Error(), "bin/evil mode") {
		t.Fatalf("want the create refused naming bin/evil's mode, got %v", err)
	}
	if len(fx.inner.creates) != 0 {
		t.Fatalf("a task was created: %+v", fx.inner.creates)
	}
	for _, p := range []string{"data", "bin"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); !os.IsNotExist(err) {
			t.Fatalf("the refused diff was applied in part: %s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc", "keep")); err != nil {
		t.Fatal(err)
	}
	if r := fx.marks.Refused(id); r == nil || r.Image != "rootfs-diff.tar" || r.Field != "bin/evil mode" {
		t.Fatalf("the refusal left for cri-shim: %+v", r)
	}
}

// setuidLayer writes a diff of an ordinary file, then a set-user-ID binary
// of root.
func setuidLayer(t *testing.T, path string) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "data/first", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, Uid: os.Getuid(), Gid: os.Getgid()})
	tw.Write([]byte("1"))
	tw.WriteHeader(&tar.Header{Name: "bin/evil", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 4, Uid: 0, Gid: 0})
	tw.Write([]byte("\x7fELF"))
	tw.Close()
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The same rules decide each header while the diff is applied: a diff that
// changed after its check is stopped at the entry that breaks them.
func TestApplyFiltersEachHeader(t *testing.T) {
	fx := newFixture(t)
	rootfs := filepath.Join(fx.bundle, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(t.TempDir(), "rootfs-diff.tar")
	setuidLayer(t, diff)
	err := applyDiff(context.Background(), rootfs, diff, criutest.DefaultSpec(), 1<<20)
	if err == nil || !strings.Contains(err.Error(), "bin/evil mode") {
		t.Fatalf("apply: %v, want bin/evil refused", err)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin", "evil")); !os.IsNotExist(err) {
		t.Fatalf("the set-user-ID binary was applied: %v", err)
	}
}

// The mark's bound on the diff's expanded size is the one the runtime shim
// holds it to.
func TestMarkedDiffBound(t *testing.T) {
	fx := newFixture(t)
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	layer(t, diff, map[string]string{"data/big": strings.Repeat("x", 8192)}, "")
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff, RootfsDiffMaxBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err == nil || !strings.Contains(err.Error(), "data/big size") {
		t.Fatalf("a diff above the mark's bound: %v", err)
	}
	if len(fx.inner.creates) != 0 {
		t.Fatal("a task was created")
	}
}

// A create that asks for a restore (containerd's own: a checkpoint image
// imported by CreateContainer) without cri-shim's mark is refused rather
// than handed to runc unchecked.
func TestUnmarkedCheckpointIsRefused(t *testing.T) {
	fx := newFixture(t)
	r := fx.request()
	r.Checkpoint = filepath.Join(fx.bundle, "..", "restore", "checkpoint")
	_, err := fx.svc.Create(context.Background(), r)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "restores only checkpoints cri-shim staged and checked") || !strings.Contains(err.Error(), r.Checkpoint) {
		t.Fatalf("want FailedPrecondition refusing the unmarked restore, got %v", err)
	}
	if len(fx.inner.creates) != 0 {
		t.Fatalf("the restore was handed to runc: %+v", fx.inner.creates)
	}
}

func TestUnusableMarkFailsTheCreate(t *testing.T) {
	fx := newFixture(t)
	if err := os.Mkdir(fx.marks.Path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.marks.Path, id), []byte(`{"images":"relative"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err == nil {
		t.Fatal("created with a mark that cannot be used")
	}
	if len(fx.inner.creates) != 0 {
		t.Fatal("the task was created fresh in place of its restore")
	}
}

// A diff that is not a tar is refused before the task is created; one the
// rules allow but the rootfs cannot take (an entry below a file) fails
// after, and the half-made task is deleted.
func TestFailedDiffDeletesTheTask(t *testing.T) {
	fx := newFixture(t)
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	if err := os.WriteFile(diff, []byte("not a tar at all, but long enough to be read as one......"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err == nil || !strings.Contains(err.Error(), "not a layer tar") || len(fx.inner.creates) != 0 {
		t.Fatalf("a diff that is not a tar: %v, %d tasks created", err, len(fx.inner.creates))
	}

	fx = newFixture(t)
	if err := os.MkdirAll(filepath.Join(fx.bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.bundle, "rootfs", "blocker"), []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	layer(t, diff, map[string]string{"blocker/below": "x"}, "")
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err == nil {
		t.Fatal("created with a diff that cannot be applied")
	}
	if len(fx.inner.deletes) != 1 || fx.inner.deletes[0] != id {
		t.Fatalf("the half-made task was not deleted: %v", fx.inner.deletes)
	}
}

func TestDiffWithoutRootfsMountsIsRefused(t *testing.T) {
	fx := newFixture(t)
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	layer(t, diff, map[string]string{"a": "b"}, "")
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	r := fx.request()
	r.Rootfs = nil
	if _, err := fx.svc.Create(context.Background(), r); err == nil || len(fx.inner.creates) != 0 {
		t.Fatalf("created: %v %d", err, len(fx.inner.creates))
	}
}

// A checkpoint whose images exceed the bundle's spec (a capability the
// container does not have) is not restored: the create fails naming the
// field, and no task is created.
func TestImagesBeyondTheSpecAreRefused(t *testing.T) {
	fx := newFixture(t)
	fx.checkpoint.Cores[1].ThreadCore.Creds.CapEff = criutest.Caps("CAP_SYS_ADMIN")
	if err := fx.checkpoint.Write(fx.images); err != nil {
		t.Fatal(err)
	}
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.svc.Create(context.Background(), fx.request())
	if err == nil || !strings.Contains(err.Error(), "cap_eff") {
		t.Fatalf("want the create refused naming cap_eff, got %v", err)
	}
	if len(fx.inner.creates) != 0 {
		t.Fatalf("a task was created: %+v", fx.inner.creates)
	}
}

// useSpec makes spec the bundle's, and the staged images a checkpoint of
// it, edited by edit when it is not nil.
func (fx *fixture) useSpec(t *testing.T, spec *specs.Spec, edit func(*criutest.Images)) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	im := criutest.ForSpec(spec)
	if edit != nil {
		edit(im)
	}
	os.RemoveAll(fx.images)
	if err := os.Mkdir(fx.images, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := im.Write(fx.images); err != nil {
		t.Fatal(err)
	}
}

// userSpec is a container of user uid without capabilities.
func userSpec(uid, gid uint32) *specs.Spec {
	spec := criutest.DefaultSpec()
	spec.Process.User = specs.User{UID: uid, GID: gid}
	spec.Process.Capabilities = &specs.LinuxCapabilities{}
	return spec
}

// The images of a container without capabilities hold open a file its user
// could not open (its own, mode 0200), which the checkpoint's own rootfs
// changes put there: the access check runs on the rootfs with the changes
// applied, refuses naming the file, and deletes the task. The container's
// user is the test's own, so that the applier may give the files that owner
// whoever runs the test.
func TestFileTheUserCannotOpenIsRefused(t *testing.T) {
	fx := newFixture(t)
	spec := userSpec(uint32(os.Getuid()), uint32(os.Getgid()))
	open := func(name string) {
		t.Helper()
		fx.useSpec(t, spec, func(im *criutest.Images) {
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: proto.Uint32(9), Reg: &regfile.RegFileEntry{
				Id: proto.Uint32(9), Flags: proto.Uint32(0), Pos: proto.Uint64(0), Name: proto.String(name),
				Fown: &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)}}})
		})
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "secret", Mode: 0o200, Size: 1, Typeflag: tar.TypeReg, Uid: os.Getuid(), Gid: os.Getgid()})
	tw.Write([]byte("s"))
	tw.WriteHeader(&tar.Header{Name: "public", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg, Uid: os.Getuid(), Gid: os.Getgid()})
	tw.Write([]byte("p"))
	tw.Close()
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	if err := os.WriteFile(diff, tb.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	open("/public") // the positive control
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err != nil {
		t.Fatalf("a file the user may read was refused: %v", err)
	}
	fx.svc.Delete(context.Background(), &taskAPI.DeleteRequest{ID: id})
	os.RemoveAll(filepath.Join(fx.bundle, "rootfs"))

	open("/secret")
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.svc.Create(context.Background(), fx.request())
	if err == nil || !strings.Contains(err.Error(), "reg.name") || !strings.Contains(err.Error(), `"/secret"`) {
		t.Fatalf("want the create refused naming /secret, got %v", err)
	}
	if n := len(fx.inner.deletes); n != 2 || fx.inner.deletes[1] != id {
		t.Fatalf("the refused task was not deleted: %v", fx.inner.deletes)
	}
	// cri-shim learns that the checkpoint, not the node, failed the start.
	if r := fx.marks.Refused(id); r == nil || r.Image != "files.img" || !strings.Contains(r.Reason, `"/secret"`) {
		t.Fatalf("the refusal left for cri-shim: %+v", r)
	}
}

// otherUser is a user other than the test's own: 1000 (1001 if the test
// runs as 1000).
func otherUser() uint32 {
	if os.Getuid() == 1000 {
		return 1001
	}
	return 1000
}

// Issue 41's pod of user 1000 without capabilities: its diff replaces
// /etc/passwd (another user's file, root's when the test runs as root, mode
// 0644 in a 0755 /etc) with a file of its own, which passes the checks of
// each header alone. The applier refuses it at that entry, as the user could
// neither write the file nor unlink it; /etc/passwd is as it was, the task
// is deleted, and the refusal is left for cri-shim.
func TestDiffReplacingAnotherUsersFileIsRefused(t *testing.T) {
	fx := newFixture(t)
	them := otherUser()
	fx.useSpec(t, userSpec(them, them), nil)
	etc := filepath.Join(fx.bundle, "rootfs", "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	evil := "root::0:0:root:/root:/bin/sh\n"
	tw.WriteHeader(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(evil)), Uid: int(them), Gid: int(them)})
	tw.Write([]byte(evil))
	tw.Close()
	diff := filepath.Join(filepath.Dir(fx.images), "rootfs-diff.tar")
	if err := os.WriteFile(diff, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images, RootfsDiff: diff}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.svc.Create(context.Background(), fx.request())
	if err == nil || !strings.Contains(err.Error(), "checkpoint refused") || !strings.Contains(err.Error(), "etc/passwd write") {
		t.Fatalf("want the create refused naming etc/passwd, got %v", err)
	}
	if got, rerr := os.ReadFile(filepath.Join(etc, "passwd")); rerr != nil || string(got) != "root:x:0:0:root:/root:/bin/sh\n" {
		t.Fatalf("/etc/passwd after the refusal: %q %v", got, rerr)
	}
	if len(fx.inner.creates) != 1 || len(fx.inner.deletes) != 1 || fx.inner.deletes[0] != id {
		t.Fatalf("the task of the refused restore: created %d, deleted %v", len(fx.inner.creates), fx.inner.deletes)
	}
	if r := fx.marks.Refused(id); r == nil || r.Image != "rootfs-diff.tar" || r.Field != "etc/passwd write" {
		t.Fatalf("the refusal left for cri-shim: %+v", r)
	}
}

// Each entry is checked against the rootfs as the entries before it left
// it: a file in a directory the diff made just before is accepted, and the
// first entry the user could not have written stops the diff there.
func TestDiffEntriesAreCheckedAsApplied(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.Chmod(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(rootfs, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: uid, Gid: gid})
	tw.WriteHeader(&tar.Header{Name: "app/state", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, Uid: uid, Gid: gid})
	tw.Write([]byte("1"))
	tw.WriteHeader(&tar.Header{Name: "ro/x", Typeflag: tar.TypeReg, Mode: 0o644, Uid: uid, Gid: gid})
	tw.WriteHeader(&tar.Header{Name: "after", Typeflag: tar.TypeReg, Mode: 0o644, Uid: uid, Gid: gid})
	tw.Close()
	diff := filepath.Join(t.TempDir(), "rootfs-diff.tar")
	if err := os.WriteFile(diff, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	err := applyDiff(context.Background(), rootfs, diff, userSpec(uint32(uid), uint32(gid)), 1<<20)
	if err == nil || !strings.Contains(err.Error(), "ro/x write") {
		t.Fatalf("apply: %v, want ro/x refused", err)
	}
	if got, err := os.ReadFile(filepath.Join(rootfs, "app", "state")); err != nil || string(got) != "1" {
		t.Fatalf("the file in the directory the diff made: %q %v", got, err)
	}
	for _, p := range []string{"ro/x", "after"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); !os.IsNotExist(err) {
			t.Fatalf("%s was applied: %v", p, err)
		}
	}
}

// A file the images hold open is checked again at Start, where CRIU opens
// it: one swapped since the create for one the user cannot open (a shared
// volume's, say) is refused before runc restores, and cri-shim learns why.
func TestFileSwappedAfterCreateIsRefusedAtStart(t *testing.T) {
	fx := newFixture(t)
	spec := userSpec(uint32(os.Getuid()), uint32(os.Getgid()))
	fx.useSpec(t, spec, func(im *criutest.Images) {
		im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: proto.Uint32(9), Reg: &regfile.RegFileEntry{
			Id: proto.Uint32(9), Flags: proto.Uint32(0), Pos: proto.Uint64(0), Name: proto.String("/data"),
			Fown: &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)}}})
	})
	if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.svc.Create(context.Background(), fx.request()); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(fx.bundle, "rootfs", "data")
	if err := os.WriteFile(data, []byte("d"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Readable at create... swapped for a file its owner may only write.
	if err := os.Chmod(data, 0o200); err != nil {
		t.Fatal(err)
	}
	_, err := fx.svc.Start(context.Background(), &taskAPI.StartRequest{ID: id})
	if err == nil || !strings.Contains(err.Error(), `"/data"`) {
		t.Fatalf("start after the swap: %v, want it refused naming /data", err)
	}
	if len(fx.inner.starts) != 0 {
		t.Fatalf("runc's shim was asked to start (restore) the task: %v", fx.inner.starts)
	}
	if r := fx.marks.Refused(id); r == nil || r.Image != "files.img" {
		t.Fatalf("refusal left for cri-shim: %+v", r)
	}
}
