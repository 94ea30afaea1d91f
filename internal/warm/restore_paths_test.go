package warm

// Every path that restores a checkpoint reaches stageRestore, and so the
// real checks: criucheck.Check on the CRIU images and
// criucheck.CheckRootfsDiff on the rootfs changes. Each test below takes a
// checkpoint under containerd's default spec, with the images that spec
// allows (criutest.ForSpec) and one hostile edit, with no imageCheck stub,
// and restores it by one path: RestorePod; a warm start by checkpoint
// name, by PodCheckpoint name and by image reference; a warm restart, by
// the replay and by the kubelet.

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restore"
)

// hostileEdit is one edit of a checkpoint that the real checks refuse.
type hostileEdit struct {
	name string
	edit func(*ckpttest.Runtime) // made before the checkpoint is taken
	kind string                  // the refusal metric's label
	want string                  // what the refusal says
}

// setuidInDiff adds a set-user-ID binary to the rootfs changes: refused by
// the diff check, whatever the images.
var setuidInDiff = hostileEdit{
	name: "set-user-ID binary in the rootfs diff",
	edit: func(rt *ckpttest.Runtime) {
		rt.Diff = ckpttest.GzipLayer(&tar.Header{Name: "usr/bin/evil", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 4}, []byte("\x7fELF"))
	},
	kind: "rootfs_diff",
	want: "checkpoint refused: rootfs-diff.tar: usr/bin/evil mode",
}

// capInCore gives the restored process a capability the spec's effective
// set lacks: refused by the images check.
var capInCore = hostileEdit{
	name: "CAP_SYS_ADMIN in the core image",
	edit: func(rt *ckpttest.Runtime) {
		rt.EditImages = func(im *criutest.Images) { im.Cores[1].ThreadCore.Creds.CapEff = criutest.Caps("CAP_SYS_ADMIN") }
	},
	kind: "core",
	want: "checkpoint refused: core-1.img: thread_core.creds.cap_eff: has CAP_SYS_ADMIN",
}

var hostileEdits = []hostileEdit{setuidInDiff, capInCore}

// unedited is the control: the checkpoint as the capture wrote it.
var unedited = hostileEdit{name: "unedited", edit: func(*ckpttest.Runtime) {}}

// realChecks gives fx's containers containerd's default spec, has their
// captures write the CRIU images it allows, and makes the service run the
// real checks (newFixture's ckpttest.AcceptImages removed), then makes edit.
func realChecks(fx *fixture, e hostileEdit) {
	fx.rt.Spec = criutest.DefaultSpec()
	fx.imageCheck = nil
	e.edit(fx.rt)
}

// realCheckpoint is the fixture's pod (app and sidecar) checkpointed into
// fx.dir under the real checks, with edit e.
func realCheckpoint(t *testing.T, e hostileEdit) *fixture {
	t.Helper()
	return checkpointedWith(t, func(fx *fixture) { realChecks(fx, e) })
}

// refusals is what a restore told of its refusals: the pods' events and
// the count of refusals of one kind since watchRefusals.
type refusals struct {
	fx     *fixture
	kind   string
	before float64
	mu     sync.Mutex
	events []string // "namespace/pod reason: note"
}

func watchRefusals(fx *fixture, kind string) *refusals {
	r := &refusals{fx: fx, kind: kind, before: fx.refusals(kind)}
	fx.podEvent = func(ns, pod, uid, typ, reason, action, note string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.events = append(r.events, ns+"/"+pod+" "+reason+": "+note)
	}
	return r
}

// told are the events of reason.
func (r *refusals) told(reason string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if _, rest, ok := strings.Cut(e, " "); ok && strings.HasPrefix(rest, reason+": ") {
			out = append(out, e)
		}
	}
	return out
}

// once checks that one refusal saying want was told on pod (namespace/name)
// as a CheckpointRefused event and counted, and that no staged restore or
// mark is left.
func (r *refusals) once(t *testing.T, pod, want string) {
	t.Helper()
	if ev := r.told("CheckpointRefused"); len(ev) != 1 || !strings.HasPrefix(ev[0], pod+" CheckpointRefused: ") || !strings.Contains(ev[0], want) {
		t.Errorf("CheckpointRefused events %q, want one on %s saying %q", ev, pod, want)
	}
	if got := r.fx.refusals(r.kind); got != r.before+1 {
		t.Errorf("%s refusals %v, want %v", r.kind, got, r.before+1)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.fx.root, ".restore-staging")); len(ents) != 0 {
		t.Errorf("staging left: %v", ents)
	}
	if ents, _ := r.fx.rt.Marks.List(); len(ents) != 0 {
		t.Errorf("marks left: %+v", ents)
	}
}

// wantRefused checks that err is FailedPrecondition and says each of says.
func wantRefused(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition {
		t.Fatalf("%s: %v, want FailedPrecondition", what, err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%s: %v, want it to say %q", what, err, s)
		}
	}
}

// The control: unedited, the checkpoint passes the real checks and
// RestorePod stages both containers' restores, so each refusal below is its
// edit's.
func TestRealChecksAcceptTheUneditedCheckpoint(t *testing.T) {
	fx := realCheckpoint(t, unedited)
	resp, err := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
	if err != nil || len(resp.GetRestoredContainers()) != 2 {
		t.Fatalf("RestorePod of the unedited checkpoint: %v, %v", resp, err)
	}
	for _, rc := range resp.RestoredContainers {
		if ckpttest.StagedPages(t, fx.rt.Marks, rc.ContainerId) == "" {
			t.Errorf("%s: no restore staged", rc.Name)
		}
	}
}

// RestorePod: the call fails, and the sandbox and containers it created are
// removed.
func TestRestorePodRefusesAHostileCheckpoint(t *testing.T) {
	for _, e := range hostileEdits {
		t.Run(e.name, func(t *testing.T) {
			fx := realCheckpoint(t, e)
			r := watchRefusals(fx, e.kind)
			sandboxes, containers := fx.rt.SandboxCount(), fx.rt.ContainerCount()
			_, err := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
			wantRefused(t, "RestorePod", err, e.want, "everything the call created was removed")
			if s, c := fx.rt.SandboxCount(), fx.rt.ContainerCount(); s != sandboxes || c != containers {
				t.Errorf("left %d sandboxes and %d containers, had %d and %d", s, c, sandboxes, containers)
			}
			r.once(t, "ns/copy", e.want)
		})
	}
}

// refusedWarmStart is the kubelet's CreateContainer of app in sb, a
// sandbox warm-started from a checkpoint with edit e: refused, told and
// counted once, and the container created for the restore removed; the
// kubelet's retries, of app and of sidecar, are refused with the recorded
// refusal, without the checkpoint being checked again.
func refusedWarmStart(t *testing.T, fx *fixture, sb string, e hostileEdit) {
	t.Helper()
	r := watchRefusals(fx, e.kind)
	_, err := tryCreateIn(t, fx.svc, fx.rt, sb, "app")
	wantRefused(t, "CreateContainer of app", err, e.want, "the container was removed")
	if c := fx.rt.ContainersIn(t, sb); len(c) != 0 {
		t.Fatalf("%d containers left in the sandbox by the refused restore", len(c))
	}
	for _, name := range []string{"app", "sidecar"} {
		_, err := tryCreateIn(t, fx.svc, fx.rt, sb, name)
		wantRefused(t, "the kubelet's retry of "+name, err, "was refused for this pod", e.want)
	}
	if c := fx.rt.ContainersIn(t, sb); len(c) != 0 {
		t.Fatalf("%d containers in the sandbox after the retries", len(c))
	}
	r.once(t, "ns/warm", e.want)
}

// A warm start by the restore-from annotation naming a checkpoint
// directory.
func TestWarmStartByNameRefusesAHostileCheckpoint(t *testing.T) {
	for _, e := range hostileEdits {
		t.Run(e.name, func(t *testing.T) {
			fx := realCheckpoint(t, e)
			sb, err := runSandbox(t, fx.svc, fx.rt, map[string]string{podspec.RestoreFromKey: filepath.Base(fx.dir)})
			if err != nil {
				t.Fatal(err)
			}
			refusedWarmStart(t, fx, sb.PodSandboxId, e)
		})
	}
}

// A warm start by the restore-from annotation naming a PodCheckpoint
// object, resolved to the object's data directory.
func TestWarmStartByPodCheckpointRefusesAHostileCheckpoint(t *testing.T) {
	for _, e := range hostileEdits {
		t.Run(e.name, func(t *testing.T) {
			fx := realCheckpoint(t, e)
			data := layout.ObjectDirPrefix + "0001"
			if err := os.Rename(fx.dir, filepath.Join(fx.root, data)); err != nil {
				t.Fatal(err)
			}
			fx.svc.cfg.ResolveRestore = func(_ context.Context, ns, _, _, name string) (string, error) {
				if ns != "ns" || name != "my-cp" {
					return "", fmt.Errorf("no PodCheckpoint %s/%s", ns, name)
				}
				return data, nil
			}
			sb, err := runSandbox(t, fx.svc, fx.rt, map[string]string{podspec.RestoreFromKey: "my-cp"})
			if err != nil {
				t.Fatal(err)
			}
			fx.svc.mu.Lock()
			w := fx.svc.warm[sb.PodSandboxId]
			fx.svc.mu.Unlock()
			if w == nil || w.Checkpoint != data {
				t.Fatalf("warm record %+v, want the PodCheckpoint's data %s", w, data)
			}
			refusedWarmStart(t, fx, sb.PodSandboxId, e)
		})
	}
}

// A warm start from an image reference: the refused pulled checkpoint is
// removed too.
func TestWarmStartFromImageRefusesAHostileCheckpoint(t *testing.T) {
	for _, e := range hostileEdits {
		t.Run(e.name, func(t *testing.T) {
			fx, pulled, sb := pulledFixtureOf(t, realCheckpoint(t, e))
			refusedWarmStart(t, fx, sb, e)
			if _, err := os.Stat(pulled); !os.IsNotExist(err) {
				t.Fatalf("the refused pulled checkpoint is still on disk: %v", err)
			}
		})
	}
}

// A warm restart of the replay (internal/podstate): WarmRestartRequest
// answers the restore's request, and staging it once the container is
// created (Created) is refused with the checks' Refusal, told and counted,
// nothing staged and the checkpoint released; the replay then removes the
// container and creates it cold.
func TestWarmRestartRefusesAHostileCheckpoint(t *testing.T) {
	for _, e := range hostileEdits {
		t.Run(e.name, func(t *testing.T) {
			fx := realCheckpoint(t, e)
			r := watchRefusals(fx, e.kind)
			w, err := fx.svc.WarmRestartRequest(ckpttest.CtxT(t, 5*time.Second), warmReq(t, fx, "app", warmOn))
			if err != nil || w == nil || w.Created == nil {
				t.Fatalf("got %+v, %v; want a restore to stage", w, err)
			}
			created := proto.Clone(w.Request).(*runtimeapi.CreateContainerRequest)
			created.Config.Metadata.Attempt = 1
			cr, err := fx.rt.CreateContainer(ckpttest.CtxT(t, 5*time.Second), created)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Created(cr.ContainerId)
			var ref *criucheck.Refusal
			if !errors.As(err, &ref) || !strings.Contains(err.Error(), e.want) {
				t.Fatalf("staging the warm restart: %v, want a refusal saying %q", err, e.want)
			}
			w.Release()
			r.once(t, "ns/pod1", e.want)
			fx.svc.mu.Lock()
			defer fx.svc.mu.Unlock()
			if len(fx.ckpts.inUse()) != 0 {
				t.Fatalf("the refused checkpoint is still held: %v", fx.ckpts.inUse())
			}
		})
	}
}

// A warm restart the kubelet drives: its CreateContainer of the restarted
// container is answered cold (the kubelet's own request, no restore), the
// container created for the restore removed, and the refusal told as
// CheckpointRefused and as the WarmRestartFallback saying why.
func TestKubeletWarmRestartRefusesAHostileCheckpoint(t *testing.T) {
	for _, e := range hostileEdits {
		t.Run(e.name, func(t *testing.T) {
			fx := newFixture(t)
			realChecks(fx, e)
			warmRestartPod(t, fx, "sw")
			r := watchRefusals(fx, e.kind)
			id, staged := kubeletCreate(t, fx, "sw", 1)
			if staged != "" {
				t.Fatal("a restore was staged")
			}
			if c := fx.rt.ContainersIn(t, "sw"); len(c) != 1 || c[0].Status.Id != id || c[0].Config.GetAnnotations()[restore.RestoringAnnotation] != "" {
				t.Fatalf("containers of the pod after the refusal: %+v, want the cold one (%s) alone", c, id)
			}
			r.once(t, "ns/p-sw", e.want)
			if ev := r.told("WarmRestartFallback"); len(ev) != 1 || !strings.Contains(ev[0], e.want) {
				t.Errorf("WarmRestartFallback events %q, want one saying %q", ev, e.want)
			}
			if fx.svc.HookActive(proxy.StartContainer) || fx.restore.HookActive(proxy.StartContainer) {
				t.Error("the cold container's start is awaited as a restore's")
			}
		})
	}
}
