package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// rootBytes is the size of every checkpoint directory under the root but
// pulled ones (what retention counts).
func rootBytes(t testing.TB) int64 {
	var n int64
	root := node.env["CHECKPOINTS"]
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), layout.PulledDirPrefix) {
			continue
		}
		filepath.Walk(filepath.Join(root, e.Name()), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				n += fi.Size()
			}
			return nil
		})
	}
	return n
}

// tenantLoops is how many times the tenant loop runs: 6 in the suite (six
// checkpoints of tenantBlobMiB are half as much again as the cap of four and
// twice the namespace's share of three, so data that outlived its object
// would show), CRI_SHIM_TENANT_LOOP for the 50 (515 s on this
// machine at 256 MiB).
func tenantLoops() int {
	if n, err := strconv.Atoi(os.Getenv("CRI_SHIM_TENANT_LOOP")); err == nil && n > 0 {
		return n
	}
	return 6
}

// Issue 28's tenant loop, on the real stack: tenantLoops times in one namespace, a
// PodCheckpoint of a pod holding tenantBlobMiB, wait Ready, remove the node's
// finalizer, delete. The checkpoint root never exceeds its cap (the node's
// total, four times the pod's data, and a namespace's share of three); no pcp-* directory
// outlives its object (removed at the deletion, or by the sweep); another
// namespace's checkpoint survives throughout.
// tenantBlobMiB is the size of the looped pod's data: 64 MiB in the fast
// tier, the 256 MiB in the long one.
func tenantBlobMiB() int { return sized(64, 256) }

func TestTenantCheckpointLoopStaysWithinShares(t *testing.T) {
	cs := needAPIServer(t)
	blob := tenantBlobMiB()
	total, share := int64(4*blob)<<20, int64(3*blob)<<20
	withShimConfig(t, fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n", node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"]))
	withShimConfigEdit(t, func(b []byte) []byte {
		s := string(b)
		s = strings.Replace(s, "[checkpoint]\n", fmt.Sprintf("[checkpoint]\n  max_total_bytes = %d\n  max_bytes_per_namespace = %d\n", total, share), 1)
		return []byte(s)
	})
	apiKubelet(t, cs)
	pcs := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])

	other := testNamespace(t, cs, "e2e-loop-other")
	if _, err := cs.CoreV1().Pods(other).Create(ctxT(t, 10*time.Second), secretAPIPod("keep", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningSecret(t, cs, other, "keep", 2*time.Minute)
	if _, err := pcs.Create(ctxT(t, 10*time.Second), newPodCheckpoint(other, "keep", "keep", 120)); err != nil {
		t.Fatal(err)
	}
	kept := waitCheckpoint(t, pcs, other, "keep", cpv1.ReasonCompleted, 2*time.Minute)
	keptDir := filepath.Join(node.env["CHECKPOINTS"], "pcp-"+string(kept.UID))

	ns := testNamespace(t, cs, "e2e-loop")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), blobSecretAPIPod("src", "", blob), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningSecret(t, cs, ns, "src", 3*time.Minute)
	var peak int64
	t0 := time.Now()
	loops := tenantLoops()
	for i := 0; i < loops; i++ {
		name := fmt.Sprintf("cp-%d", i)
		if _, err := pcs.Create(ctxT(t, 10*time.Second), newPodCheckpoint(ns, name, "src", 120)); err != nil {
			t.Fatal(err)
		}
		waitCheckpoint(t, pcs, ns, name, cpv1.ReasonCompleted, 2*time.Minute)
		if n := rootBytes(t); n > peak {
			peak = n
		}
		pc, err := pcs.Get(ctxT(t, 10*time.Second), ns, name)
		if err != nil {
			t.Fatal(err)
		}
		pc.Finalizers = slices.DeleteFunc(pc.Finalizers, func(f string) bool { return f == cpv1.NodeDataFinalizer })
		if _, err := pcs.Update(ctxT(t, 10*time.Second), pc); err != nil {
			t.Fatalf("removing the finalizer of %s: %v", name, err)
		}
		if err := pcs.Delete(ctxT(t, 10*time.Second), ns, name); err != nil {
			t.Fatal(err)
		}
		if n := rootBytes(t); n > total {
			t.Fatalf("after %d objects the checkpoint root holds %d bytes, more than max_total_bytes %d", i+1, n, total)
		}
		if _, err := os.Stat(keptDir); err != nil {
			t.Fatalf("after %d objects, the other namespace's checkpoint is gone: %v", i+1, err)
		}
	}
	t.Logf("%d PodCheckpoints of a %d MiB pod made, unfinalized and deleted in %.0fs; the root peaked at %d MiB (cap %d MiB)",
		loops, blob, time.Since(t0).Seconds(), peak>>20, total>>20)
	eventually(t, 3*time.Minute, "no pcp-* directory without its object", func() error {
		l, err := pcs.List(ctxT(t, 10*time.Second), "", metav1.ListOptions{})
		if err != nil {
			return err
		}
		live := map[string]bool{}
		for _, pc := range l.Items {
			live["pcp-"+string(pc.UID)] = true
		}
		ents, _ := os.ReadDir(node.env["CHECKPOINTS"])
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), layout.ObjectDirPrefix) && !live[e.Name()] {
				return fmt.Errorf("%s has no object", e.Name())
			}
		}
		return nil
	})
	if got := waitCheckpoint(t, pcs, other, "keep", cpv1.ReasonCompleted, time.Minute); got.UID != kept.UID {
		t.Fatal("the other namespace's object changed")
	}
}
