package capture

import (
	"context"
	"fmt"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/typeurl/v2"
)

// DumpableMemory is the part of the container's memory a capture writes,
// from containerd's task metrics (its cgroup's memory.stat): the pages on
// the anonymous LRU lists, which hold anonymous memory and shared memory
// (tmpfs, SysV and MAP_SHARED|MAP_ANONYMOUS regions: swap-backed pages are
// never on the file lists), unevictable (mlocked) pages, and swap. CRIU
// writes present or swapped anonymous and shared pages and skips file pages
// not copied on write (criu/mem.c, should_dump_page); a file's page cache,
// which the memory working set counts, is not written. The cgroup v1 totals
// (total_*) include child cgroups; swap there is memsw less memory.
func (t *ContainerdTasks) DumpableMemory(ctx context.Context, id string) (uint64, error) {
	r, err := t.svc.Metrics(nsCtx(ctx), &tasksapi.MetricsRequest{Filters: []string{"id==" + id}})
	if err != nil {
		return 0, err
	}
	if len(r.GetMetrics()) != 1 {
		return 0, fmt.Errorf("containerd answered %d task metrics for container %s", len(r.GetMetrics()), short(id))
	}
	v, err := typeurl.UnmarshalAny(r.GetMetrics()[0].GetData())
	if err != nil {
		return 0, fmt.Errorf("task metrics of container %s: %w", short(id), err)
	}
	return dumpable(v)
}

// dumpable reads DumpableMemory's sum from cgroup v1 or v2 metrics.
func dumpable(v any) (uint64, error) {
	switch m := v.(type) {
	case *cg1.Metrics:
		s := m.GetMemory()
		if s == nil {
			return 0, fmt.Errorf("cgroup v1 metrics without memory")
		}
		n := s.GetTotalActiveAnon() + s.GetTotalInactiveAnon() + s.GetTotalUnevictable()
		if memsw, mem := s.GetSwap().GetUsage(), s.GetUsage().GetUsage(); memsw > mem {
			n += memsw - mem
		}
		return n, nil
	case *cg2.Metrics:
		s := m.GetMemory()
		if s == nil {
			return 0, fmt.Errorf("cgroup v2 metrics without memory")
		}
		return s.GetActiveAnon() + s.GetInactiveAnon() + s.GetUnevictable() + s.GetSwapUsage(), nil
	}
	return 0, fmt.Errorf("task metrics of type %T, want cgroup v1 or v2 metrics", v)
}
