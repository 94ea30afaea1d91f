package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// setMemoryLimit applies server.memory_limit unless the GOMEMLIMIT
// environment variable is set (the runtime read it at start), and returns
// the limit in effect (math.MaxInt64: none).
func setMemoryLimit(n int64) int64 {
	if os.Getenv("GOMEMLIMIT") == "" && n > 0 {
		debug.SetMemoryLimit(n)
	}
	return debug.SetMemoryLimit(-1)
}

// memoryLimitString is a memory limit for the log: "none" or bytes.
func memoryLimitString(n int64) string {
	if n == math.MaxInt64 {
		return "none"
	}
	return strconv.FormatInt(n, 10)
}

// releaseStartupPages unmaps the read-only pages of the shim's executable
// (its code and constant data) that are mapped now, and returns how many
// bytes the mappings span. Start-up maps most of a 50 MB binary: the
// initialisation of every dependency runs once, and the kernel maps the
// pages around each one touched (fault-around); they would count in the
// shim's RSS for as long as it runs. The pages stay in the page cache:
// what the shim runs afterwards is mapped back on first use, a minor
// fault (madvise(2), MADV_DONTNEED on a private file mapping). Writable
// mappings (the data the Go runtime changes) are left alone.
func releaseStartupPages() (int, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	released := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode path ("path (deleted)" once replaced)
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || strings.Join(fields[5:], " ") != exe || !strings.HasPrefix(fields[1], "r") || strings.Contains(fields[1], "w") {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return released, fmt.Errorf("/proc/self/maps: unreadable range %q", fields[0])
		}
		// By address: the range is a mapping of this process, not Go memory.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("madvise %s: %w", fields[0], errno)
		}
		released += int(end - start)
	}
	return released, sc.Err()
}
