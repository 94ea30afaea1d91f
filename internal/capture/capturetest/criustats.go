package capturetest

import (
	"encoding/binary"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v8/stats"
)

// DumpStatsImage is CRIU's stats-dump image holding e: the two magics, the
// entry's length, the entry (criu/stats.c, write_stats).
func DumpStatsImage(e *stats.DumpStatsEntry) ([]byte, error) {
	payload, err := (&stats.StatsEntry{Dump: e}).MarshalVT()
	if err != nil {
		return nil, err
	}
	b := binary.LittleEndian.AppendUint32(nil, stats.ImgServiceMagic)
	b = binary.LittleEndian.AppendUint32(b, stats.StatsMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...), nil
}

// WriteDumpStats writes e into CRIU's work directory as CRIU does at the end
// of a dump, as stats-dump.
func WriteDumpStats(workDir string, e *stats.DumpStatsEntry) error {
	b, err := DumpStatsImage(e)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(workDir, stats.StatsDump), b, 0o600)
}
