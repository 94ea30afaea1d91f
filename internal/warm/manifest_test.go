package warm

import (
	"context"
	"encoding/json"
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

// Manifests whose names would build paths outside containers/ (or are no
// container name the API allows) are refused, whatever archive they claim.
func TestManifestNamesAreContainerNames(t *testing.T) {
	manifest := func(c []layout.ContainerEntry, x []layout.ExitedEntry) *layout.Manifest {
		return &layout.Manifest{FormatVersion: layout.Version, Containers: c, Exited: x}
	}
	one := func(name string) []layout.ContainerEntry {
		return []layout.ContainerEntry{{Name: name, Archive: layout.ArchiveName(name)}}
	}
	for _, tc := range []struct {
		name string
		m    *layout.Manifest
		ok   bool
	}{
		{"plain", manifest(one("app"), nil), true},
		{"label with digits and dash", manifest(one("web-1"), []layout.ExitedEntry{{Name: "init-0"}}), true},
		{"63 characters", manifest(one(strings.Repeat("a", 63)), nil), true},
		{"dot-dot up two", manifest([]layout.ContainerEntry{{Name: "../../x", Archive: "containers/../../x.tar"}}, nil), false},
		{"dot-dot up one", manifest(one(".."), nil), false},
		{"slash", manifest(one("a/b"), nil), false},
		{"absolute", manifest([]layout.ContainerEntry{{Name: "/etc/x", Archive: "containers//etc/x.tar"}}, nil), false},
		{"dot", manifest(one("a.b"), nil), false},
		{"upper case", manifest(one("App"), nil), false},
		{"underscore", manifest(one("a_b"), nil), false},
		{"leading dash", manifest(one("-a"), nil), false},
		{"trailing dash", manifest(one("a-"), nil), false},
		{"64 characters", manifest(one(strings.Repeat("a", 64)), nil), false},
		{"NUL", manifest(one("a\x00"), nil), false},
		{"empty", manifest(one(""), nil), false},
		{"exited dot-dot", manifest(one("app"), []layout.ExitedEntry{{Name: "../../etc"}}), false},
		{"exited slash", manifest(one("app"), []layout.ExitedEntry{{Name: "x/y"}}), false},
		{"exited empty", manifest(one("app"), []layout.ExitedEntry{{Name: ""}}), false},
		{"exited twice", manifest(one("app"), []layout.ExitedEntry{{Name: "i"}, {Name: "i"}}), false},
		{"exited also captured", manifest(one("app"), []layout.ExitedEntry{{Name: "app"}}), false},
		{"archive elsewhere", manifest([]layout.ContainerEntry{{Name: "app", Archive: "containers/../app.tar"}}, nil), false},
	} {
		err := tc.m.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
		// The same through the bytes a file would hold.
		b, _ := json.Marshal(tc.m)
		if _, err := layout.ParseManifest(b); (err == nil) != tc.ok {
			t.Errorf("%s: layout.ParseManifest = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// Every path built from a manifest stays inside the checkpoint directory
// once symlinks are followed: an archive (or containers/) that is a symlink
// out of it is refused by RestorePod and by a warm start, before anything is
// created, and a warm start re-checks when the kubelet creates the container.
func TestArchiveSymlinksOutOfTheCheckpointAreRefused(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside.tar")
	if err := os.WriteFile(outside, []byte("not yours"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		escape func(t *testing.T, dir string)
	}{
		{"archive symlink to a file outside", func(t *testing.T, dir string) {
			p := filepath.Join(dir, layout.ArchiveName("app"))
			os.Remove(p)
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"archive relative symlink up", func(t *testing.T, dir string) {
			p := filepath.Join(dir, layout.ArchiveName("app"))
			os.Remove(p)
			if err := os.Symlink("../../"+filepath.Base(dir)+"-sibling.tar", p); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-sibling.tar"), []byte("x"), 0o600)
		}},
		{"containers dir symlink outside", func(t *testing.T, dir string) {
			c := filepath.Join(dir, layout.ContainersDir)
			moved := filepath.Join(filepath.Dir(outside), "moved-"+filepath.Base(dir))
			if err := os.Rename(c, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, c); err != nil {
				t.Fatal(err)
			}
		}},
		{"archive is a directory", func(t *testing.T, dir string) {
			p := filepath.Join(dir, layout.ArchiveName("app"))
			os.Remove(p)
			os.Mkdir(p, 0o700)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := checkpointed(t)
			tc.escape(t, fx.dir)
			_, err := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar"))
			if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "archive") {
				t.Errorf("RestorePod: %v, want FailedPrecondition about an archive", err)
			}
			_, err = runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: filepath.Base(fx.dir)})
			if status.Code(proxy.Status(err)) != codes.FailedPrecondition {
				t.Errorf("warm start: %v, want FailedPrecondition", err)
			}
			if fx.rt.SandboxCount() != 2 {
				t.Errorf("a refused restore created a sandbox")
			}
		})
	}

	// Swapped in after the warm start began: refused when the kubelet creates
	// the container, and nothing is created.
	fx := checkpointed(t)
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: filepath.Base(fx.dir)})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(fx.dir, layout.ArchiveName("app"))
	os.Remove(p)
	os.Symlink(outside, p)
	n := fx.rt.ContainerCount()
	_, err = fx.svc.CreateContainer(ckpttest.CtxT(t, 5*time.Second), fx.rt.CreateReq(t, sb.PodSandboxId, "app"),
		func(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return fx.rt.CreateContainer(ctx, r)
		})
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("archive swapped for a symlink out: %v", err)
	}
	if fx.rt.ContainerCount() != n {
		t.Fatal("a container was created from a symlink out of the checkpoint")
	}
}

// A manifest that is itself a symlink is not followed (a checkpoint is
// written by the shim, which never makes one).
func TestManifestSymlinkIsNotFollowed(t *testing.T) {
	fx := checkpointed(t)
	real := filepath.Join(t.TempDir(), layout.ManifestFile)
	b, err := os.ReadFile(filepath.Join(fx.dir, layout.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(real, b, 0o600)
	os.Remove(filepath.Join(fx.dir, layout.ManifestFile))
	os.Symlink(real, filepath.Join(fx.dir, layout.ManifestFile))
	if _, err := layout.ReadManifest(fx.dir); err == nil {
		t.Fatal("a symlinked manifest was read")
	}
	if _, err := fx.restore.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar")); status.Code(proxy.Status(err)) != codes.NotFound {
		t.Fatalf("RestorePod of a symlinked manifest: %v", err)
	}
}

// At checkpoint time a container whose name is no DNS-1123 label is refused
// (its manifest could not be restored), and an exited one is left out.
func TestCheckpointRefusesNamesThatAreNotLabels(t *testing.T) {
	fx := newFixture(t)
	fx.rt.AddContainer(t, "sb1", "c9", "App_1", runtimeapi.ContainerState_CONTAINER_RUNNING, 35, 0)
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c9"))
	if status.Code(proxy.Status(err)) != codes.InvalidArgument || !strings.Contains(err.Error(), "DNS-1123") {
		t.Fatalf("container App_1: %v", err)
	}
	fx.rt.AddContainer(t, "sb1", "i9", "Init.old", runtimeapi.ContainerState_CONTAINER_EXITED, 5, 0)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	m, err := layout.ReadManifest(fx.dir)
	if err != nil {
		t.Fatalf("the checkpoint's manifest does not validate: %v", err)
	}
	for _, x := range m.Exited {
		if x.Name == "Init.old" {
			t.Fatal("an exited container whose name is no label is in the manifest")
		}
	}
}
