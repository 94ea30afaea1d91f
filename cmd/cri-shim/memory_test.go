package main

import (
	"math"
	"os"
	"runtime/debug"
	"testing"

	"github.com/cri-shim/cri-shim/internal/procstat"
)

// The pages released are those the test binary mapped: its file-backed
// RSS drops, and it runs on.
func TestReleaseStartupPages(t *testing.T) {
	before := procstat.StatusKB(os.Getpid(), "RssFile")
	n, err := releaseStartupPages()
	if err != nil {
		t.Fatal(err)
	}
	after := procstat.StatusKB(os.Getpid(), "RssFile")
	if n == 0 || after >= before {
		t.Fatalf("released mappings of %d bytes; RssFile %d kB before, %d kB after", n, before, after)
	}
	t.Logf("mappings of %d MiB; RssFile %d kB -> %d kB", n>>20, before, after)
}

func TestSetMemoryLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	if got := setMemoryLimit(64 << 20); got != 64<<20 {
		t.Fatalf("limit %d, want 64 MiB", got)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if got := setMemoryLimit(0); got != math.MaxInt64 || memoryLimitString(got) != "none" {
		t.Fatalf("limit %d (%s) with none asked", got, memoryLimitString(got))
	}
	t.Setenv("GOMEMLIMIT", "1GiB")
	if got := setMemoryLimit(64 << 20); got != math.MaxInt64 {
		t.Fatalf("limit %d although GOMEMLIMIT is set", got)
	}
}
