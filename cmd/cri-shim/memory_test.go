package main

import (
	"math"
	"os"
	"runtime/debug"
	"slices"
	"strings"
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

// A mapping with pages of its own (relocated read-only data of a PIE build)
// is never released; one of the file only is.
func TestCleanExecutableMappings(t *testing.T) {
	smaps := `00400000-00800000 r-xp 00000000 fe:00 12 /usr/bin/cri-shim
Size:               4096 kB
Private_Dirty:       692 kB
Anonymous:             0 kB
00800000-00900000 r--p 00400000 fe:00 12 /usr/bin/cri-shim
Private_Dirty:         8 kB
Anonymous:             8 kB
00900000-00a00000 rw-p 00500000 fe:00 12 /usr/bin/cri-shim
Private_Dirty:         0 kB
00a00000-00b00000 r--p 00600000 fe:00 12 /usr/bin/cri-shim (deleted)
Private_Dirty:         0 kB
Anonymous:             0 kB
00b00000-00c00000 r--p 00000000 fe:00 13 /usr/lib/other
Private_Dirty:         0 kB
`
	got, err := cleanExecutableMappings(strings.NewReader(smaps), "/usr/bin/cri-shim")
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{0x400000, 0x800000}, {0xa00000, 0xb00000}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %x, want %x", got, want)
	}
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
