package ckptstore

// Admission of a checkpoint before its pod is frozen. Retention (retention.go)
// judges a checkpoint once it is written; by then the pod was frozen and its
// memory written to disk. So before anything is paused a CheckpointPod is
// refused (ResourceExhausted, nothing paused or written) when
//
//   - the pod's previous checkpoint began less than pod_min_gap ago;
//   - its estimated size would take its namespace over max_bytes_per_namespace,
//     or the node over max_total_bytes, even after retention removed every
//     checkpoint it could (scheduled and 'cri-shim checkpoint' ones, not one a
//     restore reads; never PodCheckpoint data nor named checkpoints), the
//     estimates of the captures admitted and not yet retained counted too;
//   - max_concurrent_captures captures run and none ends within the call's
//     deadline (it waits its turn until then, first come first served).
//
// The estimate, per container, is its memory as CRIU writes it, from
// containerd's task metrics of its cgroup (capture's DumpableMemory: the
// anonymous LRU lists, which hold anonymous and shared memory, unevictable
// pages and swap; CRIU writes present or swapped anonymous and shared pages
// and skips file pages not copied on write, criu/mem.c, should_dump_page),
// plus the writable layer's used bytes from the CRI's container stats (the
// snapshotter's usage, refreshed in the background by containerd), plus
// estimateOverhead for CRIU's own images and the archive's framing.
// Without the task metrics (Config.ContainerMemory nil) the memory is the
// CRI's working set (memory.current, or memory.usage_in_bytes on cgroup v1,
// less inactive file pages: containerd v2.2
// internal/cri/server/container_stats_list.go, getWorkingSetV2) and swap,
// which also counts active file cache: higher still. So the estimate bounds
// the memory part from above, except for pages shared copy-on-write between
// processes after a fork, which CRIU writes once per process; the rootfs
// part is the layer's size, which its compressed tar does not exceed by
// more than its headers. The check after the write (Retain) stays for what
// the estimate misses.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// estimateOverhead is added per container to its memory and writable layer:
// CRIU's images besides the pages (core, mm, files, pagemap: tens of KiB
// for an ordinary process tree), the spec and config dumps, tar headers.
// (Store.overhead; tests whose fake captures write a few bytes set less.)
const estimateOverhead = 1 << 20

// admission is the store's state of checkpoints admitted and not ended.
type admission struct {
	// slots holds a token per capture running; nil: no bound.
	slots chan struct{}

	mu sync.Mutex
	// reserved is the estimated bytes of the captures admitted and not
	// yet retained, by namespace, and their total.
	reserved      map[string]int64
	reservedTotal int64
	// began is when each pod's (by UID) last admitted checkpoint began,
	// kept for PodMinGap.
	began map[string]time.Time
}

func newAdmission(maxConcurrent int) *admission {
	a := &admission{reserved: map[string]int64{}, began: map[string]time.Time{}}
	if maxConcurrent > 0 {
		a.slots = make(chan struct{}, maxConcurrent)
	}
	return a
}

// Admit is capture.Config.Admit: it admits a capture before its pause.
func (s *Store) Admit(ctx context.Context, a capture.Admission) (func(), error) {
	pod := a.Namespace + "/" + a.Pod
	if err := s.checkGap(a.UID, pod); err != nil {
		s.admissionRefused.WithLabelValues("pod_min_gap").Inc()
		return nil, err
	}
	var est int64
	if s.cfg.MaxBytesPerNamespace > 0 || s.cfg.MaxTotalBytes > 0 {
		var err error
		if est, err = s.estimate(ctx, a.Containers); err != nil {
			s.admissionRefused.WithLabelValues("estimate").Inc()
			return nil, err
		}
		if why, err := s.reserve(a.Namespace, est); err != nil {
			s.admissionRefused.WithLabelValues(why).Inc()
			return nil, err
		}
	}
	unreserve := func() {
		s.adm.mu.Lock()
		s.adm.reserved[a.Namespace] -= est
		if s.adm.reserved[a.Namespace] <= 0 {
			delete(s.adm.reserved, a.Namespace)
		}
		s.adm.reservedTotal -= est
		s.adm.mu.Unlock()
	}
	release, err := s.takeSlot(ctx, a.Margin)
	if err != nil {
		unreserve()
		s.admissionRefused.WithLabelValues("max_concurrent_captures").Inc()
		return nil, err
	}
	if s.cfg.PodMinGap > 0 && a.UID != "" {
		s.adm.mu.Lock()
		s.adm.began[a.UID] = s.now()
		s.adm.mu.Unlock()
	}
	var once sync.Once
	return func() { once.Do(func() { unreserve(); release() }) }, nil
}

// checkGap refuses a checkpoint of the pod uid begun less than PodMinGap
// after its last one, and forgets the pods whose gap has passed.
func (s *Store) checkGap(uid, pod string) error {
	gap := s.cfg.PodMinGap
	if gap <= 0 || uid == "" {
		return nil
	}
	now := s.now()
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	for u, t := range s.adm.began {
		if now.Sub(t) >= gap {
			delete(s.adm.began, u)
		}
	}
	if t, ok := s.adm.began[uid]; ok {
		left := gap - now.Sub(t)
		return fmt.Errorf("%w: pod %s was last checkpointed %s ago, and checkpoint.pod_min_gap is %s: retry in %s",
			errdefs.ErrResourceExhausted, pod, now.Sub(t).Round(time.Millisecond), gap, left.Round(time.Millisecond))
	}
	return nil
}

// estimate is the checkpoint's estimated size: per container, its memory
// working set, swap, writable layer and estimateOverhead (see the top of
// this file). Stats the runtime does not give make it fail (Unavailable):
// a bound that cannot be checked is not passed.
func (s *Store) estimate(ctx context.Context, ids []string) (int64, error) {
	var total int64
	for _, id := range ids {
		r, err := s.rt.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: id})
		if err != nil {
			return 0, fmt.Errorf("%w: estimating the checkpoint's size before the pause: the runtime's stats of container %s: %v", errdefs.ErrUnavailable, short(id), err)
		}
		st := r.GetStats()
		mem := st.GetMemory()
		if mem.GetWorkingSetBytes() == nil && mem.GetUsageBytes() == nil {
			return 0, fmt.Errorf("%w: estimating the checkpoint's size before the pause: the runtime reports no memory use of container %s", errdefs.ErrUnavailable, short(id))
		}
		used := mem.GetWorkingSetBytes().GetValue()
		if mem.GetWorkingSetBytes() == nil {
			used = mem.GetUsageBytes().GetValue()
		}
		used += st.GetSwap().GetSwapUsageBytes().GetValue()
		if s.cfg.ContainerMemory != nil {
			if used, err = s.cfg.ContainerMemory(ctx, id); err != nil {
				return 0, fmt.Errorf("%w: estimating the checkpoint's size before the pause: the memory of container %s: %v", errdefs.ErrUnavailable, short(id), err)
			}
		}
		n := used + st.GetWritableLayer().GetUsedBytes().GetValue() + uint64(s.overhead)
		if n > 1<<62 || total > 1<<62-int64(n) {
			return 0, fmt.Errorf("%w: estimating the checkpoint's size: container %s reports %d bytes", errdefs.ErrOutOfRange, short(id), n)
		}
		total += int64(n)
	}
	return total, nil
}

// reserve admits est more bytes of namespace ns when
// they fit its share and the node's total after what retention could
// remove, counting the captures admitted and not yet retained; it returns
// the metric's reason and the refusal otherwise.
func (s *Store) reserve(ns string, est int64) (string, error) {
	// Held from the listing on: a capture that ends meanwhile is then
	// either still reserved or on disk, never neither.
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	all, _ := List(s.cfg.Root)
	inUse := s.inUseNow()
	var fixedNS, fixedTotal int64 // what retention cannot remove
	for _, c := range all {
		if strings.HasPrefix(c.Name, layout.PulledDirPrefix) || c.Manifest.Managed && inUse[c.Dir] == 0 {
			continue
		}
		fixedTotal += c.Manifest.SizeBytes
		if c.Manifest.Pod.Namespace == ns {
			fixedNS += c.Manifest.SizeBytes
		}
	}
	if share := s.cfg.MaxBytesPerNamespace; share > 0 && fixedNS+s.adm.reserved[ns]+est > share {
		return "max_bytes_per_namespace", fmt.Errorf("%w: the checkpoint is estimated at %d bytes (the containers' memory and writable layers), and namespace %s holds %d bytes of checkpoints retention may not remove, %d more being written; "+
			"together more than its share of %d (checkpoint.max_bytes_per_namespace); delete some of its PodCheckpoints or named checkpoints",
			errdefs.ErrResourceExhausted, est, ns, fixedNS, s.adm.reserved[ns], share)
	}
	if max := s.cfg.MaxTotalBytes; max > 0 && fixedTotal+s.adm.reservedTotal+est > max {
		return "max_total_bytes", fmt.Errorf("%w: the checkpoint is estimated at %d bytes (the containers' memory and writable layers), and the node holds %d bytes of checkpoints retention may not remove, %d more being written; "+
			"together more than checkpoint.max_total_bytes (%d)", errdefs.ErrResourceExhausted, est, fixedTotal, s.adm.reservedTotal, max)
	}
	s.adm.reserved[ns] += est
	s.adm.reservedTotal += est
	return "", nil
}

// takeSlot waits for one of the node's max_concurrent_captures slots until
// margin before ctx's deadline, first come first served; release gives it
// back.
func (s *Store) takeSlot(ctx context.Context, margin time.Duration) (release func(), err error) {
	if s.adm.slots == nil {
		return func() {}, nil
	}
	release = func() { <-s.adm.slots }
	select {
	case s.adm.slots <- struct{}{}:
		return release, nil
	default:
	}
	deadline, ok := ctx.Deadline()
	if !ok || time.Until(deadline) <= margin {
		return nil, s.slotsBusy(0)
	}
	start := s.now()
	wctx, cancel := context.WithDeadline(ctx, deadline.Add(-margin))
	defer cancel()
	s.admissionWaiting.Inc()
	defer s.admissionWaiting.Dec()
	select {
	case s.adm.slots <- struct{}{}:
		return release, nil
	case <-wctx.Done():
		return nil, s.slotsBusy(s.now().Sub(start))
	}
}

func (s *Store) slotsBusy(waited time.Duration) error {
	return fmt.Errorf("%w: the node's %d capture slots (checkpoint.max_concurrent_captures) are taken, and none was freed within the call's deadline (waited %s); retry later",
		errdefs.ErrResourceExhausted, cap(s.adm.slots), waited.Round(time.Millisecond))
}
