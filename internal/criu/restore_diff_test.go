package criu

import (
	"archive/tar"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// A checkpoint whose rootfs changes hold a set-user-ID binary is refused at
// staging, before any mark reaches the runtime shim: RestorePod fails
// naming the entry, the pod gets a CheckpointRefused event, the refusal is
// counted, and nothing of the restore is left.
func TestSetuidRootfsDiffIsRefusedAtStaging(t *testing.T) {
	fx := newFixture(t)
	fx.rt.diff = gzipLayer(&tar.Header{Name: "usr/bin/evil", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 4}, []byte("\x7fELF"))
	if _, err := fx.svc.CheckpointPod(ctxT(t, 5*time.Second), cpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	var events []string
	fx.svc.cfg.PodEvent = func(ns, pod, uid, typ, reason, action, note string) {
		events = append(events, ns+"/"+pod+" "+reason+": "+note)
	}
	before := testutil.ToFloat64(fx.svc.metrics.refusals.WithLabelValues("rootfs_diff"))
	_, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), restoreReq(fx.dir, "app", "sidecar"))
	if status.Code(proxy.Status(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "checkpoint refused: rootfs-diff.tar: usr/bin/evil mode") {
		t.Fatalf("RestorePod of a set-user-ID diff: %v, want FailedPrecondition naming usr/bin/evil", err)
	}
	if len(events) != 1 || !strings.Contains(events[0], "ns/copy CheckpointRefused") || !strings.Contains(events[0], "usr/bin/evil mode") {
		t.Fatalf("events %q, want one CheckpointRefused naming the entry", events)
	}
	if got := testutil.ToFloat64(fx.svc.metrics.refusals.WithLabelValues("rootfs_diff")); got != before+1 {
		t.Errorf("rootfs_diff refusals %v, want %v", got, before+1)
	}
	if ents, _ := os.ReadDir(fx.svc.stagingRoot()); len(ents) != 0 {
		t.Fatalf("staging left: %v", ents)
	}
	if ents, _ := fx.svc.marks().List(); len(ents) != 0 {
		t.Fatalf("marks left: %+v", ents)
	}
}

// The mark carries the bound the diff was checked against: the configured
// one, or the fixed one without.
func TestMarkCarriesTheDiffBound(t *testing.T) {
	for _, tc := range []struct{ configured, want int64 }{{0, restoremark.MaxRootfsDiffBytes}, {1 << 20, 1 << 20}, {1 << 40, restoremark.MaxRootfsDiffBytes}} {
		fx := checkpointed(t)
		fx.svc.cfg.RootfsDiffMaxBytes = tc.configured
		if _, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), restoreReq(fx.dir, "app", "sidecar")); err != nil {
			t.Fatal(err)
		}
		ents, _ := fx.svc.marks().List()
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
	if _, err := fx.svc.RestorePod(ctxT(t, 5*time.Second), restoreReq(fx.dir, "app", "sidecar")); err == nil || !strings.Contains(err.Error(), "rootfs-diff.tar") {
		t.Fatalf("a diff above the configured bound: %v", err)
	}
}
