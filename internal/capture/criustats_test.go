package capture

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/stats"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/capture/capturetest"
)

func statsImage(t *testing.T, e *stats.StatsEntry) []byte {
	t.Helper()
	if e.Dump != nil {
		b, err := capturetest.DumpStatsImage(e.Dump)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A restore's statistics, in the same frame.
	b, err := capturetest.DumpStatsImage(nil)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := e.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(b[stats.SizeOffset:], uint32(len(payload)))
	return append(b[:stats.PayloadOffset], payload...)
}

func TestDumpStats(t *testing.T) {
	good := statsImage(t, &stats.StatsEntry{Dump: &stats.DumpStatsEntry{FreezingTime: proto.Uint32(10), FrozenTime: proto.Uint32(250000),
		MemdumpTime: proto.Uint32(20000), MemwriteTime: proto.Uint32(180000), PagesScanned: proto.Uint64(9), PagesSkippedParent: proto.Uint64(0),
		PagesWritten: proto.Uint64(16384), PagesLazy: proto.Uint64(0)}})
	restore := statsImage(t, &stats.StatsEntry{Restore: &stats.RestoreStatsEntry{PagesCompared: proto.Uint64(1), PagesSkippedCow: proto.Uint64(0),
		ForkingTime: proto.Uint32(1), RestoreTime: proto.Uint32(1)}})
	long := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(long[stats.SizeOffset:], uint32(len(good)))
	badMagic := append([]byte(nil), good...)
	badMagic[0] ^= 1
	for _, c := range []struct {
		name string
		file []byte // nil: none
		ok   bool
	}{
		{"dump statistics", good, true},
		{"no file", nil, false},
		{"empty", []byte{}, false},
		{"header cut", good[:7], false},
		{"wrong magic", badMagic, false},
		{"length past the end", long, false},
		{"payload cut", good[:len(good)-2], false},
		{"restore statistics", restore, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.file != nil {
				if err := os.WriteFile(filepath.Join(dir, dumpStatsFile), c.file, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			st, err := dumpStats(dir)
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok %v", err, c.ok)
			}
			if c.ok && (st.GetMemwriteTime() != 180000 || st.GetPagesWritten() != 16384) {
				t.Fatalf("read %v", st)
			}
		})
	}
}
