package ckptstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// exhausted fails the test unless err is ResourceExhausted saying says.
func exhausted(t *testing.T, err error, says string) {
	t.Helper()
	if status.Code(proxy.Status(err)) != codes.ResourceExhausted || !strings.Contains(err.Error(), says) {
		t.Fatalf("got %v, want ResourceExhausted saying %q", err, says)
	}
}

// A namespace whose checkpoints retention may not remove already fill its
// share with the new one's estimate gets its pod refused before any pause:
// nothing paused, nothing written. Managed checkpoints of the namespace do
// not count (retention removes them to make room), and the node's total is
// checked the same way.
func TestAdmissionRefusesOverShareBeforePause(t *testing.T) {
	fx := newFixture(t)
	fx.store.overhead = 0
	// An unmanaged (named) checkpoint of namespace "ns", kept whatever happens.
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1")); err != nil {
		t.Fatal(err)
	}
	named, err := layout.ReadManifest(fx.dir)
	if err != nil {
		t.Fatal(err)
	}
	fx.rt.Memory = 1000
	fx.store.cfg.MaxBytesPerNamespace = named.SizeBytes + 999 // the pod's 1000 bytes do not fit
	pauses := fx.rt.Tasks.Pauses()
	out := filepath.Join(fx.root, "over")
	os.Mkdir(out, 0o700)
	_, err = fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(out, "c1"))
	exhausted(t, err, "namespace ns holds")
	if !strings.Contains(err.Error(), "checkpoint.max_bytes_per_namespace") || !strings.Contains(err.Error(), "nothing was paused") {
		t.Fatalf("the refusal does not say why: %v", err)
	}
	if n := fx.rt.Tasks.Pauses(); n != pauses {
		t.Fatalf("%d pauses for a refused checkpoint", n-pauses)
	}
	if got := ckpttest.Entries(t, out); len(got) != 0 {
		t.Fatalf("a refused checkpoint wrote %v", got)
	}

	// The share holds the estimate: admitted.
	fx.store.cfg.MaxBytesPerNamespace = named.SizeBytes + 1000
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: out,
		ContainerIds: []string{"c1"}, Options: map[string]string{capture.OptionManaged: "true"}}); err != nil {
		t.Fatalf("a checkpoint within the share: %v", err)
	}
	// That one is managed: it does not count against the next.
	out2 := filepath.Join(fx.root, "next")
	os.Mkdir(out2, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: out2,
		ContainerIds: []string{"c1"}, Options: map[string]string{capture.OptionManaged: "true"}}); err != nil {
		t.Fatalf("a checkpoint whose room retention makes: %v", err)
	}

	// The node's total: namespace "ns"'s named checkpoint counts for a pod
	// of any namespace.
	fx.store.cfg.MaxBytesPerNamespace, fx.store.cfg.MaxTotalBytes = 0, named.SizeBytes+500
	pauses = fx.rt.Tasks.Pauses()
	out3 := filepath.Join(fx.root, "total")
	os.Mkdir(out3, 0o700)
	_, err = fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb2", OutputPath: out3, ContainerIds: []string{"c3"}})
	exhausted(t, err, "checkpoint.max_total_bytes")
	if n := fx.rt.Tasks.Pauses(); n != pauses {
		t.Fatalf("%d pauses for a checkpoint over the node's total", n-pauses)
	}
}

// Captures admitted and not yet retained count: a second one of the
// namespace that would not fit beside the first waits for nothing and is
// refused; once the first is done, its bytes are on disk (or not) and no
// longer reserved.
func TestAdmissionCountsCapturesInProgress(t *testing.T) {
	fx := newFixture(t)
	fx.store.overhead = 0
	fx.rt.Memory = 600
	fx.store.cfg.MaxBytesPerNamespace = 1000
	a := capture.Admission{Namespace: "ns", Pod: "p", UID: "u1", Containers: []string{"c1"}}
	done, err := fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), a)
	if err != nil {
		t.Fatal(err)
	}
	b := a
	b.UID = "u2"
	_, err = fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), b)
	exhausted(t, err, "600 more being written")
	done()
	done() // once only
	done2, err := fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), b)
	if err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	done2()
	if fx.store.adm.reservedTotal != 0 || len(fx.store.adm.reserved) != 0 {
		t.Fatalf("reservations left: %d %v", fx.store.adm.reservedTotal, fx.store.adm.reserved)
	}
}

// No stats, no estimate: with a bound to check, the call is refused
// (Unavailable), nothing paused; without bounds, stats are not asked for.
func TestAdmissionWithoutStats(t *testing.T) {
	fx := newFixture(t)
	fx.rt.StatsErr = status.Error(codes.Unimplemented, "no stats")
	fx.store.cfg.MaxTotalBytes = 1 << 40
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1"))
	if status.Code(proxy.Status(err)) != codes.Unavailable || !strings.Contains(err.Error(), "estimating the checkpoint's size") {
		t.Fatalf("got %v", err)
	}
	assertClean(t, fx, "refused for want of stats")
	fx.store.cfg.MaxTotalBytes = 0
	calls := fx.rt.StatsCalls
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1")); err != nil {
		t.Fatal(err)
	}
	if fx.rt.StatsCalls != calls {
		t.Fatalf("stats asked for without a bound to check")
	}
}

// With max_concurrent_captures = 1, a call while a capture runs waits for
// it within its deadline, and one whose deadline comes first is refused.
func TestAdmissionConcurrentCaptures(t *testing.T) {
	fx := newFixture(t)
	fx.store.adm = newAdmission(1)
	a := capture.Admission{Namespace: "ns", Pod: "p", UID: "u1", Containers: []string{"c1"}, Margin: 10 * time.Millisecond}
	first, err := fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), a)
	if err != nil {
		t.Fatal(err)
	}
	b := a
	b.UID = "u2"
	start := time.Now()
	_, err = fx.store.Admit(ckpttest.CtxT(t, 200*time.Millisecond), b)
	exhausted(t, err, "the node's 1 capture slots (checkpoint.max_concurrent_captures) are taken")
	if time.Since(start) < 150*time.Millisecond {
		t.Fatalf("refused after %s: the call did not wait within its deadline", time.Since(start))
	}
	got := make(chan error, 1)
	go func() {
		done, err := fx.store.Admit(ckpttest.CtxT(t, 30*time.Second), b)
		if done != nil {
			defer done()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("admitted while the slot is taken: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	first()
	if err := <-got; err != nil {
		t.Fatalf("the waiting call, once the slot is free: %v", err)
	}
	// A call that cannot wait is refused at once.
	third, err := fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), a)
	if err != nil {
		t.Fatal(err)
	}
	defer third()
	_, err = fx.store.Admit(context.Background(), b)
	exhausted(t, err, "waited 0s")
}

// A pod is not checkpointed again within pod_min_gap of its last start; the
// refusal says how long is left; another pod is not held back.
func TestAdmissionPodMinGap(t *testing.T) {
	fx := newFixture(t)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	fx.store.now = func() time.Time { return now }
	fx.store.cfg.PodMinGap = 10 * time.Second
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1")); err != nil {
		t.Fatal(err)
	}
	now = now.Add(4 * time.Second)
	pauses := fx.rt.Tasks.Pauses()
	out := filepath.Join(fx.root, "again")
	os.Mkdir(out, 0o700)
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(out, "c1"))
	exhausted(t, err, "pod ns/pod1 was last checkpointed 4s ago, and checkpoint.pod_min_gap is 10s: retry in 6s")
	if fx.rt.Tasks.Pauses() != pauses || len(ckpttest.Entries(t, out)) != 0 {
		t.Fatal("a refused checkpoint paused or wrote")
	}
	other := filepath.Join(fx.root, "other")
	os.Mkdir(other, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb2", OutputPath: other, ContainerIds: []string{"c3"}}); err != nil {
		t.Fatalf("another pod: %v", err)
	}
	now = now.Add(6 * time.Second)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(out, "c1")); err != nil {
		t.Fatalf("after the gap: %v", err)
	}
	// A refusal before the gap's start does not count as a checkpoint.
	fx.store.cfg.MaxTotalBytes = 1
	now = now.Add(time.Minute)
	third := filepath.Join(fx.root, "third")
	os.Mkdir(third, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(third, "c1")); status.Code(proxy.Status(err)) != codes.ResourceExhausted {
		t.Fatalf("over the total: %v", err)
	}
	fx.store.cfg.MaxTotalBytes = 0
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(third, "c1")); err != nil {
		t.Fatalf("after a refusal by size: %v", err)
	}
}

// With containerd's count of the memory a capture writes, the file cache in
// the CRI's working set does not count; without it the working set does.
func TestAdmissionEstimatesDumpableMemory(t *testing.T) {
	fx := newFixture(t)
	fx.store.overhead = 0
	fx.rt.Memory, fx.rt.Layer = 1<<30, 100 // a gigabyte of working set, mostly file cache
	fx.store.cfg.MaxBytesPerNamespace = 1000
	a := capture.Admission{Namespace: "ns", Pod: "p", UID: "u1", Containers: []string{"c1", "c2"}}
	_, err := fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), a)
	exhausted(t, err, "estimated at 2147483848 bytes")
	fx.store.cfg.ContainerMemory = func(_ context.Context, id string) (uint64, error) { return 300, nil }
	done, err := fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), a)
	if err != nil {
		t.Fatalf("2 x (300 + 100) bytes within a share of 1000: %v", err)
	}
	done()
	fx.store.cfg.ContainerMemory = func(_ context.Context, id string) (uint64, error) { return 0, errors.New("no task") }
	_, err = fx.store.Admit(ckpttest.CtxT(t, 5*time.Second), a)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "the memory of container c1: no task") {
		t.Fatalf("without the task's metrics: %v", err)
	}
}
