package warm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// A restore-from name that is no directory is resolved (a PodCheckpoint's
// location); the resolver's refusal fails RunPodSandbox with its reason; a
// directory name is used as before; and a resolved directory is still bound
// to its namespace.
func TestWarmStartResolvesRestoreNames(t *testing.T) {
	fx := newFixture(t)
	cp := filepath.Join(fx.root, "pcp-0001")
	os.Mkdir(cp, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(cp, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(fx.root, "plain")
	os.Mkdir(plain, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(plain, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	var asked []string
	fx.svc.cfg.ResolveRestore = func(ctx context.Context, ns, pod, uid, name string) (string, error) {
		asked = append(asked, ns+"/"+name)
		if _, ok := ctx.Deadline(); !ok {
			return "", errors.New("the call's context has no deadline")
		}
		switch name {
		case "my-cp":
			return "pcp-0001", nil
		case "far":
			return "", fmt.Errorf("%w: CheckpointNotReady: PodCheckpoint \"far\" of namespace \"ns\" is being looked up", errdefs.ErrUnavailable)
		}
		return "", errors.New("PodSpecMismatch: spec.containers[0].image differs")
	}
	sb, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "my-cp"})
	if err != nil {
		t.Fatalf("resolved name: %v", err)
	}
	if w := fx.svc.warm[sb.PodSandboxId]; w == nil || w.Checkpoint != "pcp-0001" {
		t.Fatalf("warm record %+v, want the resolved directory", w)
	}
	_, err = runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "other"})
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "PodSpecMismatch: spec.containers[0].image") {
		t.Errorf("resolver's refusal: %v", err)
	}
	// A refusal that says the answer is not in yet stays Unavailable.
	_, err = runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "far"})
	if status.Code(proxy.Status(err)) != codes.Unavailable || !strings.Contains(err.Error(), "is being looked up; the pod stays pending") {
		t.Errorf("resolver not done yet: %v", err)
	}
	asked = nil
	if _, err := runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "plain"}); err != nil || len(asked) != 0 {
		t.Errorf("a directory name: %v, resolver asked %v", err, asked)
	}
	// An object's data named directly would skip the object's checks.
	_, err = runSandboxIn(t, fx.svc, fx.rt, "ns", map[string]string{podspec.RestoreFromKey: "pcp-0001"})
	if status.Code(proxy.Status(err)) != codes.InvalidArgument || len(asked) != 0 {
		t.Errorf("PodCheckpoint data named directly: %v, resolver asked %v", err, asked)
	}
	// The namespace binding holds for what a resolver answers.
	_, err = runSandboxIn(t, fx.svc, fx.rt, "evil", map[string]string{podspec.RestoreFromKey: "my-cp"})
	if status.Code(proxy.Status(err)) != codes.NotFound || !strings.Contains(err.Error(), "own namespace") {
		t.Errorf("resolved into another namespace's checkpoint: %v", err)
	}
}
