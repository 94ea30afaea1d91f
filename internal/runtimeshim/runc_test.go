package runtimeshim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// fakeRunc writes an executable that prints version as `runc --version`
// does and names it in the bundle's runtime file, as the runc shim would.
func fakeRunc(t *testing.T, fx *fixture, version string) {
	bin := filepath.Join(t.TempDir(), "runc-"+version)
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'runc version "+version+"'\necho 'spec: 1.0.2'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.bundle, "runtime"), []byte(bin), 0o600); err != nil {
		t.Fatal(err)
	}
}

// On a cgroup v2 node a restore needs runc 1.2 or later: an older one is
// refused after the create (the task deleted), a newer one restores.
func TestRestoreOnCgroupV2NeedsRunc12(t *testing.T) {
	defer func(f func() string) { nodeCgroupMode = f }(nodeCgroupMode)
	nodeCgroupMode = func() string { return layout.CgroupV2 }
	for _, tc := range []struct {
		version string
		refused bool
	}{{"1.1.5", true}, {"1.2.0", false}, {"1.3.4", false}} {
		t.Run(tc.version, func(t *testing.T) {
			fx := newFixture(t)
			fakeRunc(t, fx, tc.version)
			if err := fx.marks.Write(id, restoremark.Mark{Images: fx.images}); err != nil {
				t.Fatal(err)
			}
			_, err := fx.svc.Create(context.Background(), fx.request())
			if !tc.refused {
				if err != nil {
					t.Fatalf("runc %s: %v", tc.version, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "runc 1.1 restores") {
				t.Fatalf("runc %s on cgroup v2: got %v, want the restore refused", tc.version, err)
			}
			if len(fx.inner.deletes) != 1 {
				t.Fatalf("the refused task was not deleted: %v", fx.inner.deletes)
			}
		})
	}
}
