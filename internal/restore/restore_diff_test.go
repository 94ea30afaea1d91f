package restore

import (
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// The mark carries the bound the diff was checked against: the configured
// one, or the fixed one without.
func TestMarkCarriesTheDiffBound(t *testing.T) {
	for _, tc := range []struct{ configured, want int64 }{{0, restoremark.MaxRootfsDiffBytes}, {1 << 20, 1 << 20}, {1 << 40, restoremark.MaxRootfsDiffBytes}} {
		fx := checkpointed(t)
		fx.svc.cfg.RootfsDiffMaxBytes = tc.configured
		if _, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar")); err != nil {
			t.Fatal(err)
		}
		ents, _ := fx.rt.Marks.List()
		if len(ents) != 2 {
			t.Fatalf("marks %+v", ents)
		}
		for _, e := range ents {
			if e.Mark == nil || e.Mark.RootfsDiffMaxBytes != tc.want {
				t.Fatalf("configured %d: mark %+v, want the diff bound %d", tc.configured, e.Mark, tc.want)
			}
		}
	}
	fx := checkpointed(t)
	fx.svc.cfg.RootfsDiffMaxBytes = 100 // below the fake's diff, expanded
	if _, err := fx.svc.RestorePod(ckpttest.CtxT(t, 5*time.Second), ckpttest.RestoreReq(fx.dir, "app", "sidecar")); err == nil || !strings.Contains(err.Error(), "rootfs-diff.tar") {
		t.Fatalf("a diff above the configured bound: %v", err)
	}
}
