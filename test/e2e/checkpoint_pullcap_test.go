package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// The pods of TestPulledCheckpointCap write capBlobMiB MiB of random data
// before they count, so that each checkpoint's archive is 8 to 9 MiB: the
// cap of pullCapBytes then holds one pulled checkpoint and not two.
const (
	capBlobMiB   = 8
	pullCapBytes = 12 << 20
)

// archiveBytes is what a pull of checkpoint cp fetches: its archives.
func archiveBytes(t *testing.T, cp string) int64 {
	t.Helper()
	m, err := layout.ReadManifest(filepath.Join(node.env["CHECKPOINTS"], cp))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range m.Containers {
		n += c.SizeBytes
	}
	return n
}

// pulledDirOf is the directory a restore from ref (by digest) pulls into.
func pulledDirOf(ref string) string {
	return filepath.Join(node.env["CHECKPOINTS"], layout.PulledDir(ref[len(ref)-64:]))
}

// pulledMetrics are the cap's two counters.
func pulledMetrics(t *testing.T) (refused, evicted float64) {
	t.Helper()
	all := scrapeMetrics(t)
	return metricValue(all, "cri_shim_pulled_checkpoint_pulls_refused_total"), metricValue(all, "cri_shim_pulled_checkpoints_evicted_total")
}

// deletePodAndPulled deletes pod ns/name and waits until the pulled
// checkpoint dir, which only it used, went with it.
func deletePodAndPulled(t *testing.T, cs kubernetes.Interface, ns, name, dir string) {
	t.Helper()
	if err := cs.CoreV1().Pods(ns).Delete(ctxT(t, 10*time.Second), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, filepath.Base(dir)+" removed with "+name, func() error {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("%s: %v", dir, err)
		}
		return nil
	})
}

// The node-wide cap on pulled checkpoints ([checkpoint]
// pull_max_total_bytes; docs/checkpoint-oci.md, "Node-wide cap"), set to
// hold one of two checkpoints X and Y of a pod, not both. Pod p1 restores
// from X (pulled); pod p2 naming Y while p1 still uses X stays Pending with
// ResourceExhausted stating the cap, and nothing of Y is fetched; once p1
// is deleted, X goes with it (removed as its last pod's, not by the cap) and
// p2 comes up from Y at the kubelet's retry. Then, with p2 gone too, a
// pulled X that no pod uses and that was last used more than 5 minutes ago
// is removed by the cap to make room for pod p3's pull of Y
// (cri_shim_pulled_checkpoints_evicted_total goes up by one). The kubelet's
// log (what kubectl logs shows) has each restored process counting on, and
// no image name is added (issue 27).
func TestPulledCheckpointCap(t *testing.T) {
	cs := needAPIServer(t)
	addr := startRegistry(t)
	withShimConfigEdit(t, func(b []byte) []byte {
		cfg := strings.Replace(string(b), "[checkpoint]\n", fmt.Sprintf("[checkpoint]\n  pull_max_bytes = %d\n  pull_max_total_bytes = %d\n", pullCapBytes, pullCapBytes), 1)
		return []byte(cfg + "\n" + plainRegistryConfig(addr))
	})
	apiKubelet(t, cs)
	// apiKubelet left no pod on the node, so no pulled checkpoint of an
	// earlier test is in use; the cap counts every one, so none may stay.
	left, _ := filepath.Glob(filepath.Join(node.env["CHECKPOINTS"], layout.PulledDirPrefix+"*"))
	for _, d := range left {
		t.Logf("removing %s, left by an earlier test", d)
		os.RemoveAll(d)
	}
	ns := testNamespace(t, cs, "e2e-cap")
	createPod(t, cs, ns, blobSecretAPIPod("src", "", capBlobMiB))
	secret := runningSecret(t, cs, ns, "src", 2*time.Minute)
	refX := pushedCheckpoint(t, ns, "src", "e2e-cap-x-"+ns, addr+"/e2e/cap-"+ns+":x", "--plain-http")
	refY := pushedCheckpoint(t, ns, "src", "e2e-cap-y-"+ns, addr+"/e2e/cap-"+ns+":y", "--plain-http")
	bx, by := archiveBytes(t, "e2e-cap-x-"+ns), archiveBytes(t, "e2e-cap-y-"+ns)
	if bx > pullCapBytes || by > pullCapBytes || bx+by <= pullCapBytes {
		t.Fatalf("checkpoints of %d and %d archive bytes: want each within the cap of %d and both over it", bx, by, pullCapBytes)
	}
	t.Logf("X %s (%d bytes), Y %s (%d bytes), cap %d", refX, bx, refY, by, pullCapBytes)
	dirX, dirY := pulledDirOf(refX), pulledDirOf(refY)
	restore := func(pod, ref string) { createPod(t, cs, ns, secretAPIPod(pod, ref)) }
	running := func(pod string) { restoredWithSecret(t, cs, ns, pod, secret) }
	refused0, evicted0 := pulledMetrics(t)
	images := imagesSnapshot(t) // after the pushes

	restore("p1", refX)
	running("p1")
	restore("p2", refY)
	msg := sandboxEvent(t, cs, ns, "p2", fmt.Sprintf("over [checkpoint] pull_max_total_bytes %d", pullCapBytes))
	if !strings.Contains(msg, "code = ResourceExhausted") || !strings.Contains(msg, fmt.Sprintf("this pull needs %d bytes", by)) {
		t.Errorf("p2 while p1 uses X: %s\nwant ResourceExhausted for Y's %d bytes", msg, by)
	}
	t.Logf("p2 refused: %s", msg)
	stillPending(t, cs, ns, "p2", secret)
	if refused, evicted := pulledMetrics(t); refused <= refused0 || evicted != evicted0 {
		t.Errorf("refused pulls %v -> %v, evicted %v -> %v: want refusals counted, nothing evicted (X is in use)", refused0, refused, evicted0, evicted)
	}
	if _, err := os.Stat(dirY); !os.IsNotExist(err) {
		t.Errorf("Y was pulled over the cap: %s: %v", dirY, err)
	}

	deletePodAndPulled(t, cs, ns, "p1", dirX)
	t.Logf("X went with p1: %s", shimLogLine(t, "removed a pulled checkpoint", filepath.Base(dirX)))
	running("p2")
	if _, evicted := pulledMetrics(t); evicted != evicted0 {
		t.Errorf("evicted %v -> %v: X went with its pod, the cap had nothing to remove", evicted0, evicted)
	}

	// A pulled checkpoint no pod uses, last used more than 5 minutes ago:
	// one whose pod went before the kubelet's retry. It is made here from the
	// CLI's pull of X (the same verified bytes) renamed into X's directory
	// with its time set back, as the test cannot wait 5 minutes.
	deletePodAndPulled(t, cs, ns, "p2", dirY)
	assertNoImageChange(t, images, "the restores of p1 and p2 and the refused ones of p2")
	shimRun(t, "checkpoint", "pull", refX, "e2e-cap-unused-"+ns, "--plain-http")
	images = imagesSnapshot(t) // after the CLI's pull
	if err := os.Rename(filepath.Join(node.env["CHECKPOINTS"], "e2e-cap-unused-"+ns), dirX); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-10 * time.Minute)
	if err := os.Chtimes(dirX, old, old); err != nil {
		t.Fatal(err)
	}
	refused1, _ := pulledMetrics(t)
	restore("p3", refY)
	running("p3")
	refused, evicted := pulledMetrics(t)
	if evicted != evicted0+1 || refused != refused1 {
		t.Errorf("evicted %v -> %v, refused %v -> %v: want X evicted for Y's pull, no refusal", evicted0, evicted, refused1, refused)
	}
	if _, err := os.Stat(dirX); !os.IsNotExist(err) {
		t.Errorf("the unused X is still on the node: %s: %v", dirX, err)
	}
	if l := shimLogLine(t, "removed a pulled checkpoint", filepath.Base(dirX)); !strings.Contains(l, "pull_max_total_bytes") {
		t.Errorf("X removed, but not by the cap: %s", l)
	} else {
		t.Logf("X evicted: %s", l)
	}
	assertNoImageChange(t, images, "the restore of p3 and the eviction of X")
}
