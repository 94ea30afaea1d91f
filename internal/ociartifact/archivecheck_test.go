package ociartifact

import (
	"archive/tar"
	"fmt"
	"io"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hostileArchive streams a tar of n members named by name(i), each empty,
// as a pulled archive would arrive; nothing is held beyond one header.
func hostileArchive(n int, name func(int) string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		for i := 0; i < n; i++ {
			h := &tar.Header{Name: name(i), Typeflag: tar.TypeReg, Mode: 0o600, Format: tar.FormatPAX}
			if err := tw.WriteHeader(h); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(tw.Close())
	}()
	return pr
}

// peakHeap runs f and returns the largest live heap seen above the heap
// before it, sampled every millisecond.
func peakHeap(f func()) uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(s); return s[0].Value.Uint64() }
	base := read()
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
				if v := read(); v > base && v-base > peak.Load() {
					peak.Store(v - base)
				}
			}
		}
	}()
	f()
	close(done)
	return peak.Load()
}

// Issue 28 item 4: archives built to exhaust the checker are refused with
// the heap bounded (64 MiB) whatever their size: 4,000 members of 256 KiB
// names (1 GiB of names), a million members, and 1 GiB of distinct 4 KiB
// names.
func TestHostileArchivesBoundedMemory(t *testing.T) {
	const bound = 64 << 20
	cases := []struct {
		name string
		n    int
		mk   func(int) string
		want string
	}{
		{"256 KiB names", 4000, func(i int) string { return fmt.Sprintf("checkpoint/%d-%s", i, strings.Repeat("x", 256<<10)) }, "more than 4096"},
		{"a million members", 1_000_000, func(i int) string { return fmt.Sprintf("checkpoint/core-%d.img", i) }, "more than 100000 entries"},
		{"1 GiB of 4 KiB names", 1 << 18, func(i int) string { return fmt.Sprintf("checkpoint/%08d-%s", i, strings.Repeat("y", 4000)) }, "bytes of member names"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			peak := peakHeap(func() { err = checkArchive(hostileArchive(tc.n, tc.mk)) })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a refusal (%s), got %v", tc.want, err)
			}
			t.Logf("refused: %v; peak heap growth %.1f MiB", err, float64(peak)/(1<<20))
			if peak > bound {
				t.Fatalf("heap grew %d bytes during the check (bound %d)", peak, bound)
			}
		})
	}
}
