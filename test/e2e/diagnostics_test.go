package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// logAbout logs the last n lines of the kubelet's and the shim's logs that
// mention what, so that a test that timed out waiting for a pod says why the
// pod did not get there (the logs go with the node when the suite ends).
func logAbout(t testing.TB, what string, n int) {
	t.Helper()
	for _, f := range []string{"kubelet.log", "cri-shim.log"} {
		b, err := os.ReadFile(filepath.Join(node.env["NODE_RUN"], f))
		if err != nil {
			t.Logf("%s: %v", f, err)
			continue
		}
		var hits []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, what) {
				hits = append(hits, l)
			}
		}
		if len(hits) > n {
			hits = hits[len(hits)-n:]
		}
		t.Logf("%s, last %d lines about %s:\n%s", f, len(hits), what, strings.Join(hits, "\n"))
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(node.env["CHECKPOINTS"], &fs); err == nil {
		t.Logf("checkpoint root: %d MiB free of %d MiB", fs.Bavail*uint64(fs.Bsize)>>20, fs.Blocks*uint64(fs.Bsize)>>20)
	}
}
