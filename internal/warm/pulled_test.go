package warm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

const testDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// A restore-from image reference is handed to PullRestore and the pulled
// directory warm-starts the pod under the namespace binding; its refusals
// keep their class (a foreign namespace reads as a missing checkpoint);
// without PullRestore, and for an oci- name given directly, it is refused;
// the pulled directory goes with the last sandbox using it.
func TestWarmStartFromImageReference(t *testing.T) {
	fx := newFixture(t)
	pulled := filepath.Join(fx.root, layout.PulledDir(testDigest))
	os.Mkdir(pulled, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(pulled, "c1", "c2")); status.Code(proxy.Status(err)) != codes.InvalidArgument {
		t.Fatalf("CheckpointPod into an oci- directory: %v, want InvalidArgument", err)
	}
	src := filepath.Join(fx.root, "src")
	os.Mkdir(src, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(src, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	os.Remove(pulled)
	ref := "reg.example:5000/cp/web@sha256:" + testDigest
	ann := map[string]string{podspec.RestoreFromKey: ref}

	if _, err := runSandboxIn(t, fx.svc, fx.rt, "ns", ann); status.Code(proxy.Status(err)) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "restores no image references") {
		t.Fatalf("no PullRestore: %v", err)
	}

	var asked []string
	answer := func(ctx context.Context, ns, pod, uid, r string, reserve func(int64) (func(), error)) (string, error) {
		asked = append(asked, ns+" "+r)
		if reserve == nil {
			t.Error("PullRestore asked without the service's cap on pulled checkpoints")
		}
		if _, err := os.Stat(pulled); err != nil {
			if err := os.Rename(src, pulled); err != nil {
				return "", err
			}
		}
		return layout.PulledDir(testDigest), nil
	}
	fx.svc.cfg.PullRestore = answer
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", ann)
	if err != nil {
		t.Fatalf("warm start from %s: %v", ref, err)
	}
	if w := fx.svc.warm[sb.PodSandboxId]; w == nil || w.Checkpoint != layout.PulledDir(testDigest) {
		t.Fatalf("warm record %+v, want the pulled directory", w)
	}
	if len(asked) != 1 || asked[0] != "ns "+ref {
		t.Fatalf("PullRestore asked %v", asked)
	}
	// The binding holds for what was pulled.
	if _, err := runSandboxIn(t, fx.svc, fx.rt, "evil", ann); status.Code(proxy.Status(err)) != codes.NotFound || !strings.Contains(err.Error(), "own namespace") {
		t.Errorf("pulled checkpoint of another namespace: %v", err)
	}
	// Named directly, a pulled directory would skip the allow-list.
	if _, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: layout.PulledDir(testDigest)}); status.Code(proxy.Status(err)) != codes.InvalidArgument {
		t.Errorf("oci- directory named directly: %v", err)
	}
	for _, tc := range []struct {
		err  error
		code codes.Code
		says string
	}{
		{fmt.Errorf("%w: taken of pod x/y", layout.ErrForeignCheckpoint), codes.NotFound, "no checkpoint that a pod of namespace \"ns\" may restore"},
		{fmt.Errorf("%w: pulling: 3 of 9 bytes", errdefs.ErrUnavailable), codes.Unavailable, "3 of 9 bytes"},
		{fmt.Errorf("%w: registry not allowed", errdefs.ErrPermissionDenied), codes.PermissionDenied, "registry not allowed"},
		{fmt.Errorf("connection reset"), codes.Unavailable, "connection reset"},
		{fmt.Errorf("pulling x: %w", proxy.Errorf(errdefs.ErrResourceExhausted, "over [checkpoint] pull_max_total_bytes 9")), codes.ResourceExhausted, "pull_max_total_bytes 9"},
	} {
		fx.svc.cfg.PullRestore = func(context.Context, string, string, string, string, func(int64) (func(), error)) (string, error) {
			return "", tc.err
		}
		_, err := runSandboxIn(t, fx.svc, fx.rt, "ns", ann)
		if status.Code(proxy.Status(err)) != tc.code || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "kubelet retries") {
			t.Errorf("PullRestore answering %v: %v, want %s saying %q", tc.err, err, tc.code, tc.says)
		}
	}
	// A second pod on the same pull keeps it while the first goes.
	fx.svc.cfg.PullRestore = answer
	sb2, err := runSandboxIn(t, fx.svc, fx.rt, "ns", ann)
	if err != nil {
		t.Fatal(err)
	}
	fx.svc.SandboxGone(sb.PodSandboxId)
	if _, err := os.Stat(pulled); err != nil {
		t.Fatalf("pulled checkpoint removed while a pod uses it: %v", err)
	}
	fx.svc.SandboxGone(sb2.PodSandboxId)
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Fatalf("pulled checkpoint kept after its last pod: %v", err)
	}
}

// pulledFixture is a checkpoint of pod1 (namespace "ns") in the pulled
// directory of testDigest, and a warm-started sandbox restoring it by
// reference.
func pulledFixture(t *testing.T) (*fixture, string, string) {
	t.Helper()
	return pulledFixtureOf(t, checkpointed(t))
}

// pulledFixtureOf is pulledFixture of fx's checkpoint (fx.dir), which it
// moves into the pulled directory.
func pulledFixtureOf(t *testing.T, fx *fixture) (*fixture, string, string) {
	t.Helper()
	pulled := filepath.Join(fx.root, layout.PulledDir(testDigest))
	if err := os.Rename(fx.dir, pulled); err != nil {
		t.Fatal(err)
	}
	fx.svc.cfg.PullRestore = func(context.Context, string, string, string, string, func(int64) (func(), error)) (string, error) {
		if _, err := os.Stat(pulled); err != nil {
			return "", fmt.Errorf("%w: pulling again", errdefs.ErrUnavailable)
		}
		return layout.PulledDir(testDigest), nil
	}
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "reg.example:5000/cp/web@sha256:" + testDigest})
	if err != nil {
		t.Fatal(err)
	}
	return fx, pulled, sb.PodSandboxId
}

// tryCreateIn is the kubelet's CreateContainer of name in sandbox, through svc.
func tryCreateIn(t *testing.T, svc *Service, rt *ckpttest.Runtime, sandbox, name string) (*runtimeapi.CreateContainerResponse, error) {
	return svc.CreateContainer(ckpttest.CtxT(t, 5*time.Second), rt.CreateReq(t, sandbox, name),
		func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return rt.CreateContainer(ctx, r)
		})
}

// A pulled checkpoint the image check refuses is removed at once, so a
// hostile pull costs the node no disk while its pod stays pending; the
// refusal is recorded, so the kubelet's retries (of any container of the
// pod, by this shim or a restarted one) are refused with it without the
// checkpoint being read or pulled again.
func TestRefusedPulledCheckpointIsRemovedAndStaysRefused(t *testing.T) {
	fx, pulled, sb := pulledFixture(t)
	checks := 0
	fx.imageCheck = func(string, *specs.Spec) error {
		checks++
		return &criucheck.Refusal{Image: "core-1.img", Field: "tc.creds.cap_eff", Reason: "CAP_SYS_ADMIN is not in the spec's effective set"}
	}
	_, err := tryCreateIn(t, fx.svc, fx.rt, sb, "app")
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") {
		t.Fatalf("CreateContainer of a refused checkpoint: %v, want FailedPrecondition naming the capability", err)
	}
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Fatalf("the refused pulled checkpoint is still on disk: %v", err)
	}
	if c := fx.rt.ContainersIn(t, sb); len(c) != 0 {
		t.Fatalf("%d containers left by the refused restore", len(c))
	}
	for _, name := range []string{"app", "sidecar"} {
		_, err := tryCreateIn(t, fx.svc, fx.rt, sb, name)
		if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "was refused for this pod") || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") {
			t.Fatalf("retry of %s: %v, want the recorded refusal", name, err)
		}
	}
	if checks != 1 {
		t.Fatalf("the images were checked %d times, want once", checks)
	}
	svc2, err := New(fx.svc.cfg, fx.rt, fx.restore, fx.ckpts, fx.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.cfg.Store.Subscribe(svc2.SandboxGone)
	if _, err := tryCreateIn(t, svc2, fx.rt, sb, "app"); status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "was refused for this pod") {
		t.Fatalf("retry through a restarted shim: %v, want the recorded refusal", err)
	}
	svc2.SandboxGone(sb)
	if warmRecords(svc2) != 0 {
		t.Fatal("the refused warm start's record outlived its sandbox")
	}
}

// The runtime shim's refusal at task create (the file access check, which
// needs the container's finished rootfs) is learned from the mark
// directory: the start fails, the refusal is recorded as the shim's own, and
// the pulled checkpoint goes.
func TestRuntimeShimRefusalIsRecorded(t *testing.T) {
	fx, pulled, sb := pulledFixture(t)
	fx.imageCheck = ckpttest.AcceptImages
	fx.rt.RefuseStart = &restoremark.Refusal{Image: "files.img", Field: "file 1 REG reg.name", Reason: `"/secret/token": uid 1000 cannot open it for reading`}
	resp, err := tryCreateIn(t, fx.svc, fx.rt, sb, "app")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pulled); err != nil {
		t.Fatalf("the pulled checkpoint went before any refusal: %v", err)
	}
	before := fx.refusals(criucheck.KindOf("files.img"))
	if err := fx.start(resp.ContainerId); err == nil || !strings.Contains(err.Error(), "checkpoint refused") {
		t.Fatalf("start refused by the runtime shim: %v", err)
	}
	if got := fx.refusals(criucheck.KindOf("files.img")); got != before+1 {
		t.Errorf("refusals counted %v, want %v", got, before+1)
	}
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Fatalf("the refused pulled checkpoint is still on disk: %v", err)
	}
	if ents, _ := fx.rt.Marks.List(); len(ents) != 0 {
		t.Fatalf("marks left: %+v", ents)
	}
	if left := ckpttest.Entries(t, fx.rt.Marks.Path); len(left) != 0 {
		t.Fatalf("files left in the mark directory: %v", left)
	}
	if _, err := tryCreateIn(t, fx.svc, fx.rt, sb, "app"); status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "/secret/token") {
		t.Fatalf("the kubelet's next CreateContainer: %v, want the recorded refusal (not a cold start)", err)
	}
}

// A pull whose checkpoint content is refused (layout.ErrCheckpointRefused) fails
// the sandbox FailedPrecondition, counted and told on the pod as the image
// check's refusals are.
func TestPulledContentRefusalIsAnEvent(t *testing.T) {
	fx := newFixture(t)
	var events []string
	fx.podEvent = func(ns, pod, uid, typ, reason, action, note string) {
		events = append(events, ns+"/"+pod+" "+reason+": "+note)
	}
	fx.svc.cfg.PullRestore = func(context.Context, string, string, string, string, func(int64) (func(), error)) (string, error) {
		return "", fmt.Errorf("%w: pulling x: %w", errdefs.ErrFailedPrecondition,
			fmt.Errorf("%w: archive member \"checkpoint/nnn\"...: a name of 262144 bytes, more than 4096", layout.ErrCheckpointRefused))
	}
	before := fx.refusals("archive")
	_, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "reg.example:5000/cp/web@sha256:" + testDigest})
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "more than 4096") {
		t.Fatalf("refused pull: %v, want FailedPrecondition naming the member", err)
	}
	if len(events) != 1 || !strings.Contains(events[0], "ns/warm CheckpointRefused") || !strings.Contains(events[0], "more than 4096") {
		t.Fatalf("events %q, want one CheckpointRefused naming the member", events)
	}
	if got := fx.refusals("archive"); got != before+1 {
		t.Errorf("archive refusals %v, want %v", got, before+1)
	}
}
