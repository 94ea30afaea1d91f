// Package procstat reads a process's CPU time and memory from /proc, for the
// benchmarks that report what the shim costs.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, 100 on Linux for every architecture Go supports here.
const clockTicks = 100

// CPUSeconds is the process's user+system CPU time; 0 if it cannot be read.
func CPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clockTicks
}

// StatusKB reads a kB field of /proc/<pid>/status ("VmRSS", "VmHWM"); -1 if absent.
func StatusKB(pid int, key string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, key+":"); ok {
			if f := strings.Fields(rest); len(f) >= 1 {
				if v, err := strconv.Atoi(f[0]); err == nil {
					return v
				}
			}
		}
	}
	return -1
}
