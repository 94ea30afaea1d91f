package capture

import (
	"strings"
	"testing"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
)

// The dumpable memory is the anonymous LRU lists, unevictable pages and
// swap, never the file cache, on either cgroup version.
func TestDumpableMemory(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want uint64
		err  string
	}{
		{"v1", &cg1.Metrics{Memory: &cg1.MemoryStat{TotalActiveAnon: 100, TotalInactiveAnon: 20, TotalUnevictable: 3,
			TotalActiveFile: 1 << 30, TotalInactiveFile: 1 << 30, ActiveAnon: 7,
			Usage: &cg1.MemoryEntry{Usage: 1000}, Swap: &cg1.MemoryEntry{Usage: 1400}}}, 100 + 20 + 3 + 400, ""},
		{"v1 without swap accounting", &cg1.Metrics{Memory: &cg1.MemoryStat{TotalActiveAnon: 5, Usage: &cg1.MemoryEntry{Usage: 1000}}}, 5, ""},
		{"v2", &cg2.Metrics{Memory: &cg2.MemoryStat{ActiveAnon: 100, InactiveAnon: 20, Unevictable: 3, SwapUsage: 50,
			ActiveFile: 1 << 30, InactiveFile: 1 << 30, Shmem: 60, Usage: 1 << 31}}, 173, ""},
		{"v2 without memory", &cg2.Metrics{}, 0, "without memory"},
		{"another type", "x", 0, "want cgroup v1 or v2 metrics"},
	} {
		got, err := dumpable(tc.v)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %d, %v; want %d, %q", tc.name, got, err, tc.want, tc.err)
		}
	}
}
