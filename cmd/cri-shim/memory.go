package main

import (
	"bufio"
	"fmt"
	"io"
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
// fault (madvise(2), MADV_DONTNEED on a private file mapping). Only a
// mapping every page of which is still the file's is released: one with a
// private copy of a page (Anonymous in smaps, as a position-independent
// build's relocated read-only data has) would lose what was written to it,
// and writable mappings (the data the Go runtime changes) are left alone.
// (Private_Dirty says nothing here: it counts the file's own pages not yet
// written back, as a binary just built has.)
func releaseStartupPages() (int, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	maps, err := cleanExecutableMappings(f, exe)
	if err != nil {
		return 0, err
	}
	released := 0
	for _, m := range maps {
		// By address: the range is a mapping of this process, not Go memory.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("madvise %x-%x: %w", m.start, m.end, errno)
		}
		released += int(m.end - m.start)
	}
	return released, nil
}

type mapping struct{ start, end uint64 }

// cleanExecutableMappings reads smaps and returns the read-only mappings of
// exe that hold no page of their own (Anonymous 0 kB).
func cleanExecutableMappings(r io.Reader, exe string) ([]mapping, error) {
	var out []mapping
	var cur *mapping
	clean := false
	flush := func() {
		if cur != nil && clean {
			out = append(out, *cur)
		}
		cur = nil
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") {
			// A mapping's header: address perms offset dev inode [path]
			// ("path (deleted)" once the file was replaced).
			flush()
			if len(fields) < 6 || strings.Join(fields[5:], " ") != exe && strings.Join(fields[5:], " ") != exe+" (deleted)" ||
				!strings.HasPrefix(fields[1], "r") || strings.Contains(fields[1], "w") {
				continue
			}
			lo, hi, _ := strings.Cut(fields[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil || end <= start {
				return nil, fmt.Errorf("smaps: unreadable range %q", fields[0])
			}
			cur, clean = &mapping{start, end}, true
			continue
		}
		if cur != nil && fields[0] == "Anonymous:" && (len(fields) < 2 || fields[1] != "0") {
			clean = false
		}
	}
	flush()
	return out, sc.Err()
}
