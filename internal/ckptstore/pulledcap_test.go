package ckptstore

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// mkPulled writes a pulled checkpoint directory holding size bytes, last
// changed at mtime.
func mkPulled(t *testing.T, root, name string, size int, mtime time.Time) string {
	t.Helper()
	d := filepath.Join(root, name)
	if err := os.MkdirAll(filepath.Join(d, "containers"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "containers", "app.tar"), make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(d, mtime, mtime)
	return d
}

func digestName(c byte) string { return layout.PulledDir(strings.Repeat(string(c), 64)) }

// The cap counts pulled checkpoints on disk and the pulls in progress; to
// make room it removes pulled checkpoints no pod uses, oldest first, never
// one in use, pinned or fresh, never a checkpoint made on the node; then it
// refuses with ResourceExhausted, and room given back is reserved again.
func TestPulledCapEvictsUnusedOldestFirst(t *testing.T) {
	fx := newFixture(t)
	fx.store.cfg.PullMaxTotalBytes = 1000
	old := time.Now().Add(-2 * pulledEvictAfter)
	oldest := mkPulled(t, fx.root, digestName('a'), 300, old.Add(-time.Minute))
	used := mkPulled(t, fx.root, digestName('b'), 300, old.Add(-2*time.Minute))
	pinned := mkPulled(t, fx.root, digestName('c'), 100, old.Add(-3*time.Minute))
	older := mkPulled(t, fx.root, digestName('d'), 100, old)
	fresh := mkPulled(t, fx.root, digestName('e'), 100, time.Now())
	mine := mkPulled(t, fx.root, "mine", 5000, old.Add(-time.Hour))
	real, _ := filepath.EvalSymlinks(used)
	fx.store.mu.Lock()
	fx.store.inUse[real] = 1
	fx.store.mu.Unlock()
	unpin := fx.store.PinPulled(digestName('c'))
	if got := fx.store.PulledBytes(); got != 900 {
		t.Fatalf("PulledBytes %d, want 900 (the user's checkpoint is not counted)", got)
	}

	// 900 + 250 > 1000: the oldest unused one (a, 300) goes; d (100,
	// newer) is not needed.
	rel1, err := fx.store.ReservePulled(250)
	if err != nil {
		t.Fatalf("reserve 250: %v", err)
	}
	for d, want := range map[string]bool{oldest: false, used: true, pinned: true, older: true, fresh: true, mine: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists=%v, want %v", filepath.Base(d), err == nil, want)
		}
	}
	// 600 on disk + 250 reserved + 300: only d may go (100): refused,
	// nothing reserved.
	_, err = fx.store.ReservePulled(300)
	if status.Code(proxy.Status(err)) != codes.ResourceExhausted || !strings.Contains(err.Error(), "pull_max_total_bytes 1000") {
		t.Fatalf("reserve over the cap: %v, want ResourceExhausted naming the cap", err)
	}
	if _, err := os.Stat(older); err == nil {
		t.Error("an unused old pulled checkpoint survived a refused reservation that needed its room")
	}
	// Given back, the room is reserved again; a second release is a no-op.
	rel1()
	rel1()
	rel2, err := fx.store.ReservePulled(300)
	if err != nil {
		t.Fatalf("reserve after a release: %v", err)
	}
	rel2()
	// Unpinned and unused, c goes for room too.
	unpin()
	rel3, err := fx.store.ReservePulled(600)
	if err != nil {
		t.Fatalf("reserve with the pin gone: %v", err)
	}
	rel3()
	if _, err := os.Stat(pinned); err == nil {
		t.Error("an unpinned unused pulled checkpoint was kept though its room was needed")
	}
	nothingReserved(t, fx)
}

// Without a cap nothing is removed and every reservation is granted.
func TestPulledCapZeroIsUnbounded(t *testing.T) {
	fx := newFixture(t)
	d := mkPulled(t, fx.root, digestName('a'), 100, time.Now().Add(-time.Hour))
	rel, err := fx.store.ReservePulled(1 << 40)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if _, err := os.Stat(d); err != nil {
		t.Errorf("removed without a cap: %v", err)
	}
}

// Concurrent pulls never reserve more than the cap together.
func TestPulledCapConcurrentReservations(t *testing.T) {
	fx := newFixture(t)
	const max, each = 1000, 300
	fx.store.cfg.PullMaxTotalBytes = max
	var outstanding, peak, granted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				rel, err := fx.store.ReservePulled(each)
				if err != nil {
					if status.Code(proxy.Status(err)) != codes.ResourceExhausted {
						t.Errorf("reserve: %v", err)
					}
					refused.Add(1)
					continue
				}
				granted.Add(1)
				n := outstanding.Add(each)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				outstanding.Add(-each)
				rel()
			}
		}()
	}
	wg.Wait()
	if peak.Load() > max {
		t.Errorf("%d bytes reserved at once, over the cap %d", peak.Load(), max)
	}
	if granted.Load() == 0 {
		t.Error("no reservation granted")
	}
	nothingReserved(t, fx)
}

// The cap walks and deletes directories without s.mu (warm starts take
// it: Use, PinPulled), and still judges by what holds under it: a
// directory pulled while the others were sized is counted, and one a pod
// was answered meanwhile (touched) is not evicted by its old time.
func TestPulledCapSizesAndDeletesOutsideTheLock(t *testing.T) {
	fx := newFixture(t)
	fx.store.cfg.PullMaxTotalBytes = 1000
	root, _ := filepath.EvalSymlinks(fx.root)
	old := time.Now().Add(-2 * pulledEvictAfter)
	a := mkPulled(t, root, digestName('a'), 400, old.Add(-time.Minute))
	b := mkPulled(t, root, digestName('b'), 200, old)
	c := filepath.Join(root, digestName('c'))
	underLock := func(what string) {
		if fx.store.mu.TryLock() {
			fx.store.mu.Unlock()
		} else {
			t.Errorf("%s with s.mu held", what)
		}
	}
	var once sync.Once
	sizeDir = func(dir string) int64 {
		once.Do(func() {
			underLock("sizing pulled checkpoints")
			now := time.Now()
			os.Chtimes(a, now, now)                             // answered to a pod
			mkPulled(t, root, digestName('c'), 500, time.Now()) // pulled, its reservation given back
		})
		return dirBytes(dir)
	}
	removeAll = func(p string) error { underLock("deleting a pulled checkpoint"); return os.RemoveAll(p) }
	t.Cleanup(func() { sizeDir, removeAll = dirBytes, os.RemoveAll })

	// a 400 + b 200 + c 500 + 300 > 1000; only b may go: refused.
	_, err := fx.store.ReservePulled(300)
	if status.Code(proxy.Status(err)) != codes.ResourceExhausted {
		t.Fatalf("reserve with a pull finished meanwhile: %v, want ResourceExhausted", err)
	}
	for d, want := range map[string]bool{a: true, b: false, c: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists=%v, want %v", filepath.Base(d), err == nil, want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(root, layout.PulledRemovingPrefix+"*")); len(left) != 0 {
		t.Errorf("evicted directories not deleted: %v", left)
	}
	// Room once c is gone.
	os.RemoveAll(c)
	rel, err := fx.store.ReservePulled(300)
	if err != nil {
		t.Fatal(err)
	}
	rel()
}

// nothingReserved fails t if any pull's reservation was not released.
func nothingReserved(t *testing.T, fx *fixture) {
	t.Helper()
	fx.store.mu.Lock()
	defer fx.store.mu.Unlock()
	if fx.store.pullReserved != 0 {
		t.Errorf("%d bytes still reserved after every release", fx.store.pullReserved)
	}
}
