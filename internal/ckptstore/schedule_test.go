package ckptstore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

func scheduled(t *testing.T, fx *fixture, id string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(fx.root, ScheduledPrefix+"uid-"+id+"-*"))
	var out []string
	for _, d := range m {
		if _, err := layout.ReadManifest(d); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		out = append(out, filepath.Base(d))
	}
	return out
}

// A pod with an interval is checkpointed when it has no checkpoint, not
// again until the interval passed, then again, keeping its newest `keep`.
// Pods without the annotation, with a malformed one, or with a container
// not running are left alone.
func TestScheduledCheckpoints(t *testing.T) {
	fx := newFixture(t)
	fx.store.cfg.MinInterval = time.Minute
	ckpttest.AddPod(t, fx.rt, fx.table, "sa", map[string]string{podspec.IntervalKey: "10s", podspec.KeepKey: "1"}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	ckpttest.AddPod(t, fx.rt, fx.table, "sb", map[string]string{podspec.IntervalKey: "soon"}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	ckpttest.AddPod(t, fx.rt, fx.table, "sc", map[string]string{podspec.IntervalKey: "1h"}, runtimeapi.ContainerState_CONTAINER_CREATED)
	now := time.Now()
	fx.store.now = func() time.Time { return now }
	bad := map[string]string{}
	next := fx.store.scheduleOnce(context.Background(), fx.cap, bad)
	first := scheduled(t, fx, "sa")
	if len(first) != 1 {
		t.Fatalf("first tick: %v, want one checkpoint of the scheduled pod", first)
	}
	// The schedule wakes when the pod is next due: an interval (the node's
	// minimum) after the checkpoint was taken, not at a tick after that.
	m1, err := layout.ReadManifest(filepath.Join(fx.root, first[0]))
	if err != nil {
		t.Fatal(err)
	}
	if want := m1.CheckpointedAt.Add(time.Minute); !next.Equal(want) {
		t.Fatalf("next due %v, want %v (the checkpoint's time plus the interval)", next, want)
	}
	if len(scheduled(t, fx, "sb"))+len(scheduled(t, fx, "sc")) != 0 || !strings.Contains(bad["sb"], podspec.IntervalKey) {
		t.Fatalf("malformed or not-running pods checkpointed, or the refusal not noted: %v", bad)
	}
	if _, err := os.Stat(filepath.Join(fx.root, "cp1")); err != nil {
		t.Fatal("an unrelated directory under the root was touched")
	}
	// 10s asked, the node's minimum is a minute: not due after 30 s.
	now = now.Add(30 * time.Second)
	if next := fx.store.scheduleOnce(context.Background(), fx.cap, bad); !next.Equal(m1.CheckpointedAt.Add(time.Minute)) {
		t.Fatalf("not due yet: next %v, want %v", next, m1.CheckpointedAt.Add(time.Minute))
	}
	if got := scheduled(t, fx, "sa"); len(got) != 1 {
		t.Fatalf("after 30s: %v, want no second checkpoint before the 1m minimum", got)
	}
	now = now.Add(31 * time.Second)
	fx.store.scheduleOnce(context.Background(), fx.cap, bad)
	got := scheduled(t, fx, "sa")
	if len(got) != 1 || got[0] == first[0] {
		t.Fatalf("after 61s: %v, want only a new one (keep 1), not %s", got, first[0])
	}
	m, _ := layout.ReadManifest(filepath.Join(fx.root, got[0]))
	if !m.Managed || m.Pod.UID != "uid-sa" {
		t.Fatalf("manifest %+v: want a managed checkpoint of uid-sa", m.Pod)
	}
}

// The schedule sleeps until the next pod is due, never longer than a tick
// (new pods are found at ticks) nor shorter than minScheduleWait.
func TestUntilNext(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		next time.Time
		want time.Duration
	}{
		{time.Time{}, scheduleTick},
		{now.Add(3 * time.Second), 3 * time.Second},
		{now.Add(time.Hour), scheduleTick},
		{now.Add(time.Millisecond), minScheduleWait},
		{now.Add(-time.Second), minScheduleWait},
	} {
		if got := untilNext(now, tc.next); got != tc.want {
			t.Errorf("untilNext(now, now%+v) = %v, want %v", tc.next.Sub(now), got, tc.want)
		}
	}
}

// A scheduled checkpoint a warm restart reads is not removed by keep.
func TestKeepLeavesACheckpointInUse(t *testing.T) {
	fx := newFixture(t)
	fx.store.cfg.MinInterval = time.Second
	ckpttest.AddPod(t, fx.rt, fx.table, "sa", map[string]string{podspec.IntervalKey: "1s", podspec.KeepKey: "1"}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	now := time.Now()
	fx.store.now = func() time.Time { return now }
	fx.store.scheduleOnce(context.Background(), fx.cap, map[string]string{})
	first := scheduled(t, fx, "sa")
	fx.store.mu.Lock()
	fx.store.inUse = map[string]int{filepath.Join(fx.root, first[0]): 1}
	fx.store.mu.Unlock()
	now = now.Add(2 * time.Second)
	fx.store.scheduleOnce(context.Background(), fx.cap, map[string]string{})
	if got := scheduled(t, fx, "sa"); len(got) != 2 {
		t.Fatalf("%v: want the one in use kept beside the new one", got)
	}
}

// max_bytes_per_namespace removes a namespace's oldest managed checkpoints.
func TestRetentionPerNamespace(t *testing.T) {
	fx := newFixture(t)
	fx.store.cfg.MaxBytesPerNamespace = 1
	fx.store.overhead = 0 // estimated at 0 bytes: admitted; the written ones are over
	for _, n := range []string{"ma", "mb"} {
		d := filepath.Join(fx.root, n)
		os.Mkdir(d, 0o700)
		if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: d,
			ContainerIds: []string{"c1"}, Options: map[string]string{capture.OptionManaged: "true"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(fx.root, "ma")); !os.IsNotExist(err) {
		t.Fatalf("the namespace's older checkpoint kept past max_bytes_per_namespace: %v", err)
	}
	if _, err := layout.ReadManifest(filepath.Join(fx.root, "mb")); err != nil {
		t.Fatalf("the newest (just written) removed: %v", err)
	}
}
