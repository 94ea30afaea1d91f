package criu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
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
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(pulled, "c1", "c2")); status.Code(proxy.Status(err)) != codes.InvalidArgument {
		t.Fatalf("CheckpointPod into an oci- directory: %v, want InvalidArgument", err)
	}
	src := filepath.Join(fx.root, "src")
	os.Mkdir(src, 0o700)
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(src, "c1", "c2")); err != nil {
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
		{fmt.Errorf("pulling x: %w", errorf(errdefs.ErrResourceExhausted, "over [checkpoint] pull_max_total_bytes 9")), codes.ResourceExhausted, "pull_max_total_bytes 9"},
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
	fx.svc.forgetWarm(sb.PodSandboxId)
	if _, err := os.Stat(pulled); err != nil {
		t.Fatalf("pulled checkpoint removed while a pod uses it: %v", err)
	}
	fx.svc.forgetWarm(sb2.PodSandboxId)
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Fatalf("pulled checkpoint kept after its last pod: %v", err)
	}
}

// A pulled checkpoint no pod uses is swept once old, and a pull's temporary
// directory once much older (a shim killed mid-pull); a fresh one, one in
// use, a pull that may still run and a user's checkpoint are not.
func TestUnusedPulledCheckpointsAreSwept(t *testing.T) {
	fx := newFixture(t)
	old := time.Now().Add(-2 * pulledUnusedFor)
	mk := func(name string, mtime time.Time) string {
		d := filepath.Join(fx.root, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(d, mtime, mtime)
		return d
	}
	stale := mk(layout.PulledDir(testDigest), old)
	fresh := mk(layout.PulledDir(strings.Repeat("1", 64)), time.Now())
	used := mk(layout.PulledDir(strings.Repeat("2", 64)), old)
	user := mk("mine", old)
	tmpOld := mk(pulledTempPrefix+testDigest+"-1", time.Now().Add(-2*pulledTempFor))
	tmpNew := mk(pulledTempPrefix+testDigest+"-2", old)
	fx.svc.mu.Lock()
	fx.svc.warm["sbx"] = &warmPod{SandboxID: "sbx", Dir: used}
	fx.svc.mu.Unlock()
	fx.svc.sweepPulled()
	for d, want := range map[string]bool{stale: false, fresh: true, used: true, user: true, tmpOld: false, tmpNew: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists=%v after the sweep, want %v", filepath.Base(d), err == nil, want)
		}
	}
}

// A removal that dies midway (a shim killed, or a file written into the
// directory as it was deleted) never leaves a half-removed directory under
// the oci- name, which a later pod would take for pulled: the directory is
// renamed away first, and the next sweep finishes the deletion.
func TestPulledRemovalRenamesFirst(t *testing.T) {
	fx := newFixture(t)
	root, _ := filepath.EvalSymlinks(fx.root)
	d := mkPulled(t, root, digestName('a'), 100, time.Now())
	os.WriteFile(filepath.Join(d, layout.ManifestFile), []byte("{}"), 0o600)
	removeAll = func(p string) error {
		os.Remove(filepath.Join(p, layout.ManifestFile)) // part of the way, then killed
		return fmt.Errorf("killed")
	}
	t.Cleanup(func() { removeAll = os.RemoveAll })
	fx.svc.releasePulled(d)
	if _, err := os.Lstat(d); !os.IsNotExist(err) {
		t.Fatalf("half-removed pulled checkpoint left under its name: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(root, layout.PulledRemovingPrefix+"*"))
	if len(left) != 1 {
		t.Fatalf("renamed-away directories %v, want one", left)
	}
	removeAll = os.RemoveAll
	fx.svc.sweepPulled()
	if _, err := os.Lstat(left[0]); !os.IsNotExist(err) {
		t.Errorf("the sweep left %s: %v", filepath.Base(left[0]), err)
	}
	fx.svc.mu.Lock()
	defer fx.svc.mu.Unlock()
	if len(fx.svc.removing) != 0 {
		t.Errorf("deletions still noted in progress: %v", fx.svc.removing)
	}
}

// The temporary directories of pulls a killed shim left, and deletions it
// left half done, are removed at start whatever their age (pulls run only in
// the shim; their bytes would escape the cap); the temporary directory of a
// pull of this shim is not, by the sweep nor by the clean-up of interrupted
// checkpoints.
func TestLeftoverPullsRemovedAtStart(t *testing.T) {
	var leftTemp, leftRemoving string
	fx := newFixtureWith(t, func(rt *fakeRT, cfg *Config) capture.Tasks {
		os.MkdirAll(cfg.Root, 0o700)
		leftTemp = mkPulled(t, cfg.Root, pulledTempPrefix+testDigest+"-1", 100, time.Now())
		os.WriteFile(filepath.Join(leftTemp, layout.IncompleteFile), nil, 0o600)
		leftRemoving = mkPulled(t, cfg.Root, layout.PulledRemovingPrefix+layout.PulledDir(testDigest)+"-1", 100, time.Now())
		return rt
	})
	if _, err := os.Lstat(leftTemp); !os.IsNotExist(err) {
		t.Errorf("a killed pull's temporary directory is still there after start: %v", err)
	}
	mine := mkPulled(t, fx.root, pulledTempPrefix+testDigest+"-2", 100, time.Now())
	os.WriteFile(filepath.Join(mine, layout.IncompleteFile), nil, 0o600)
	fx.svc.sweepPulled()
	fx.svc.capture.CleanIncomplete(nil)
	ents, _ := os.ReadDir(fx.root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 2 || !slices.Contains(names, filepath.Base(mine)) || !slices.Contains(names, "cp1") {
		t.Errorf("under the root after the first sweep: %v, want cp1 and this shim's pull only", names)
	}
	if _, err := os.Stat(filepath.Join(mine, "containers", "app.tar")); err != nil {
		t.Errorf("this shim's pull was emptied: %v", err)
	}
	if _, err := os.Lstat(leftRemoving); !os.IsNotExist(err) {
		t.Errorf("a deletion a killed shim left is still there: %v", err)
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
func tryCreateIn(t *testing.T, svc *Service, rt *fakeRT, sandbox, name string) (*runtimeapi.CreateContainerResponse, error) {
	return svc.CreateContainer(ctxT(t, 5*time.Second), rt.createReq(t, sandbox, name),
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
	fx.svc.imageCheck = func(string, *specs.Spec) error {
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
	if c := fx.rt.containersIn(t, sb); len(c) != 0 {
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
	svc2, err := New(fx.svc.cfg, fx.rt, fx.rt, fx.rt, fx.svc.log)
	if err != nil {
		t.Fatal(err)
	}
	svc2.imageCheck = acceptImages
	if _, err := tryCreateIn(t, svc2, fx.rt, sb, "app"); status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "was refused for this pod") {
		t.Fatalf("retry through a restarted shim: %v, want the recorded refusal", err)
	}
	svc2.forgetWarm(sb)
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
	fx.svc.imageCheck = acceptImages
	fx.rt.refuseStart = &restoremark.Refusal{Image: "files.img", Field: "file 1 REG reg.name", Reason: `"/secret/token": uid 1000 cannot open it for reading`}
	resp, err := tryCreateIn(t, fx.svc, fx.rt, sb, "app")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pulled); err != nil {
		t.Fatalf("the pulled checkpoint went before any refusal: %v", err)
	}
	before := testutil.ToFloat64(fx.svc.metrics.refusals.WithLabelValues(criucheck.KindOf("files.img")))
	if err := startC(fx.svc, fx.rt, resp.ContainerId); err == nil || !strings.Contains(err.Error(), "checkpoint refused") {
		t.Fatalf("start refused by the runtime shim: %v", err)
	}
	if got := testutil.ToFloat64(fx.svc.metrics.refusals.WithLabelValues(criucheck.KindOf("files.img"))); got != before+1 {
		t.Errorf("refusals counted %v, want %v", got, before+1)
	}
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Fatalf("the refused pulled checkpoint is still on disk: %v", err)
	}
	if ents, _ := fx.rt.marks.List(); len(ents) != 0 {
		t.Fatalf("marks left: %+v", ents)
	}
	if left := entries(t, fx.rt.marks.Path); len(left) != 0 {
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
	fx.svc.cfg.PodEvent = func(ns, pod, uid, typ, reason, action, note string) {
		events = append(events, ns+"/"+pod+" "+reason+": "+note)
	}
	fx.svc.cfg.PullRestore = func(context.Context, string, string, string, string, func(int64) (func(), error)) (string, error) {
		return "", fmt.Errorf("%w: pulling x: %w", errdefs.ErrFailedPrecondition,
			fmt.Errorf("%w: archive member \"checkpoint/nnn\"...: a name of 262144 bytes, more than 4096", layout.ErrCheckpointRefused))
	}
	before := testutil.ToFloat64(fx.svc.metrics.refusals.WithLabelValues("archive"))
	_, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "reg.example:5000/cp/web@sha256:" + testDigest})
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "more than 4096") {
		t.Fatalf("refused pull: %v, want FailedPrecondition naming the member", err)
	}
	if len(events) != 1 || !strings.Contains(events[0], "ns/warm CheckpointRefused") || !strings.Contains(events[0], "more than 4096") {
		t.Fatalf("events %q, want one CheckpointRefused naming the member", events)
	}
	if got := testutil.ToFloat64(fx.svc.metrics.refusals.WithLabelValues("archive")); got != before+1 {
		t.Errorf("archive refusals %v, want %v", got, before+1)
	}
}
