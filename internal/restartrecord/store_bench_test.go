package restartrecord

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// benchDir is CRI_SHIM_BENCH_DIR (a directory on the file system of the
// state directory to measure), else a temporary directory.
func benchDir(b *testing.B) string {
	dir := os.Getenv("CRI_SHIM_BENCH_DIR")
	if dir == "" {
		return b.TempDir()
	}
	d, err := os.MkdirTemp(dir, "bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// benchPod is a pod record of a realistic size: three containers and their
// recorded CreateContainer requests.
func benchPod() *Pod {
	p := &Pod{SandboxID: sbA, UID: "uid", Name: "bench", Namespace: "default", Phase: PhaseRunning,
		Creates: map[string][]byte{}, Latest: map[string]string{}, PhaseSince: time.Now()}
	for _, n := range []string{"init", "sidecar", "main"} {
		p.Creates[n] = []byte(strings.Repeat("r", 900))
		id := strings.Repeat(n[:1], 64)
		addInstance(p, id, n, PartNone)
		p.Latest[n] = id
		p.Seq = append(p.Seq, SeqEntry{Name: n})
	}
	return p
}

// BenchmarkStoreSave is the cost of one save of a pod record of a realistic
// size (three containers, their recorded CreateContainer requests) on the
// file system of the state directory (CRI_SHIM_BENCH_DIR, else a temp dir).
// A crash-looping pod saves about three times per restart.
func BenchmarkStoreSave(b *testing.B) {
	dir := benchDir(b)
	st, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	p := benchPod()
	b.ResetTimer()
	for i := range b.N {
		p.Restarts = i
		if err := st.Save(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreSaveAsStatefile is the same record written by statefile's
// rule (temp file, fsync, rename, fsync of the directory), the alternative
// to the slots: for the comparison in docs/operations.md.
func BenchmarkStoreSaveAsStatefile(b *testing.B) {
	dir := benchDir(b)
	p := benchPod()
	path := filepath.Join(dir, sbA+".json")
	b.ResetTimer()
	for i := range b.N {
		p.Restarts = i
		if err := statefile.WriteJSON(path, p, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}
