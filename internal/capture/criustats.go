package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v8/stats"
)

// maxStatsBytes bounds what is read of CRIU's statistics (a few dozen bytes).
const maxStatsBytes = 64 << 10

// dumpStatsFile is the file CRIU's dump statistics are in: "stats-dump",
// without the ".img" of the other images (go-criu's stats.StatsDump; seen so
// in CRIU 4's work directory on this stack).
const dumpStatsFile = stats.StatsDump

// dumpStats reads CRIU's dump statistics from the work directory of a
// capture: CRIU writes them at the end of a dump relative to its working
// directory (criu/stats.c, write_stats: open_image_at(AT_FDCWD, ...)), which
// is its work directory (--work-dir, runc's --work-path). The file is an
// image: two magics, a little-endian 32-bit length, then a StatsEntry.
// Unlike go-criu's CriuGetDumpStats, which indexes the file unchecked, a
// short or damaged file is an error.
func dumpStats(workDir string) (*stats.DumpStatsEntry, error) {
	f, err := os.Open(filepath.Join(workDir, dumpStatsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStatsBytes))
	if err != nil {
		return nil, err
	}
	if len(b) < stats.PayloadOffset {
		return nil, fmt.Errorf("%s: %d bytes, shorter than its header", dumpStatsFile, len(b))
	}
	if binary.LittleEndian.Uint32(b[stats.PrimaryMagicOffset:]) != stats.ImgServiceMagic ||
		binary.LittleEndian.Uint32(b[stats.SecondaryMagicOffset:]) != stats.StatsMagic {
		return nil, fmt.Errorf("%s: not a CRIU stats image", dumpStatsFile)
	}
	n := binary.LittleEndian.Uint32(b[stats.SizeOffset:])
	if uint64(n) > uint64(len(b)-stats.PayloadOffset) {
		return nil, fmt.Errorf("%s: entry of %d bytes in %d", dumpStatsFile, n, len(b)-stats.PayloadOffset)
	}
	var st stats.StatsEntry
	if err := st.UnmarshalVT(b[stats.PayloadOffset : stats.PayloadOffset+int(n)]); err != nil {
		return nil, fmt.Errorf("%s: %w", dumpStatsFile, err)
	}
	if st.GetDump() == nil {
		return nil, errors.New(dumpStatsFile + ": no dump statistics")
	}
	return st.GetDump(), nil
}
