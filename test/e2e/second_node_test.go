package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	"github.com/cri-shim/cri-shim/internal/podspec"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// secondNode brings up the second node of this machine (test/stack/node2.sh:
// its own containerd, shim and kubelet, registered with node 1's API server)
// with extra appended to its shim's config, waits for it to be Ready in the
// API and returns its env ($NODE2_RUN/env). It is torn down, and its Node
// object deleted, when the test ends.
func secondNode(t *testing.T, cs kubernetes.Interface, extra string) map[string]string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "node2-shim.toml")
	if err := os.WriteFile(cfg, []byte(extra), 0o644); err != nil {
		t.Fatal(err)
	}
	name := envOr("CRI_SHIM_NODE2_NAME", "cri-shim-node2")
	t.Cleanup(func() {
		if err := script("node2.sh", "down"); err != nil {
			t.Errorf("second node down: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	})
	t0 := time.Now()
	if err := script("node2.sh", "up", "--shim-config", cfg); err != nil {
		t.Fatal(err)
	}
	env, err := readEnv(filepath.Join(node2Run(), "env"))
	if err != nil {
		t.Fatal(err)
	}
	waitNodeReady(t, cs, env["NODE_NAME"])
	t.Logf("second node %s Ready %.1fs after node2.sh up", env["NODE_NAME"], time.Since(t0).Seconds())
	return env
}

// node2Run is the second node's run directory, which node 1's env names
// (its lane's, test/stack/env.sh).
func node2Run() string { return envOr("CRI_SHIM_NODE2_RUN", node.env["NODE2_RUN"]) }

// shimAPIConfig is the [kubernetes] section of a shim talking to the API as
// its node, and an allow-list entry for the TLS registry.
func shimAPIConfig(kubeconfig, nodeName, registry, ca string) string {
	return fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n\n[[checkpoint.registries]]\nhost = %q\nnamespaces = [\"*\"]\nanonymous_push = true\nca_file = %q\n",
		kubeconfig, nodeName, registry, ca)
}

// memMiB is how much memory the memory holders hold: 64 MiB in the fast
// tier, 256 MiB in the long one.
func memMiB() int { return sized(64, 256) }

// memScript fills a shell variable with memMiB of random text (three
// quarters of it random bytes, base64) and prints its md5; it prints it again
// whenever /tmp/sum appears, and counts meanwhile.
func memScript() string {
	return fmt.Sprintf(`x=$(head -c %d /dev/urandom | base64 -w 0); echo "ready sum=$(printf %%s "$x" | md5sum | cut -c1-32) len=${#x}"; `, memMiB()<<20*3/4) +
		`i=0; while true; do if [ -e /tmp/sum ]; then rm -f /tmp/sum; echo "sum=$(printf %s "$x" | md5sum | cut -c1-32)"; fi; ` +
		`echo $i; i=$((i+1)); sleep 0.1; done`
}

var sumLine = regexp.MustCompile(`(?:^|\s)sum=([0-9a-f]{32})(?: len=\d+)?\s*$`)

// memPod is a pod of two containers bound to nodeName: "mem" (memScript) and
// "counter".
func memPod(name, nodeName, restoreFrom string) *corev1.Pod {
	var ann map[string]string
	if restoreFrom != "" {
		ann = map[string]string{podspec.RestoreFromKey: restoreFrom}
	}
	p := apiPod(name, ann, "sh", "-c", memScript())
	p.Spec.NodeName = nodeName
	p.Spec.Containers[0].Name = "mem"
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
		Name: "counter", Image: busybox, ImagePullPolicy: corev1.PullNever, Command: counterCmd})
	return p
}

// apiPodLog is the log of the first instance of container c of pod ns/pod
// on the node whose env is env ("" while there is none).
func apiPodLog(env map[string]string, ns, pod, c string) string {
	m, _ := filepath.Glob(filepath.Join(env["NODE_DATA"], "pod-logs", ns+"_"+pod+"_*", c, "0.log"))
	if len(m) != 1 {
		return ""
	}
	return m[0]
}

// sums are the md5 sums a mem container logged after since, in order (the
// first is the one it printed when its memory was filled).
func sums(path string, since time.Time) []string {
	var out []string
	for _, l := range readLogLines(path) {
		if m := sumLine.FindStringSubmatch(l.text); m != nil && l.at.After(since) {
			out = append(out, m[1])
		}
	}
	return out
}

// tlsRegistryIndex reads the image index ref from the TLS registry, trusting ca.
func tlsRegistryIndex(t *testing.T, ref, ca string) (name.Reference, *remote.Descriptor, func(string) (string, error)) {
	t.Helper()
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	d, err := remote.Get(r, remote.WithTransport(tr))
	if err != nil {
		t.Fatal(err)
	}
	// containerName returns the org.criu.checkpoint.container.name of a
	// container image's manifest, by digest.
	containerName := func(digest string) (string, error) {
		img, err := remote.Image(r.Context().Digest(digest), remote.WithTransport(tr))
		if err != nil {
			return "", err
		}
		m, err := img.Manifest()
		if err != nil {
			return "", err
		}
		return m.Annotations[ociartifact.AnnotationCRIUContainerName], nil
	}
	return r, d, containerName
}

// Issue 17, "restore on another node": a pod of two containers (memMiB of
// random text in a shell's memory, and a counter) on node 1 is checkpointed
// by a PodCheckpoint whose spec.export pushes it to the TLS registry; a pod
// on node 2 (its own containerd, shim and kubelet, same API server) names the
// PodCheckpoint in restore-from, and node 2's shim resolves the name to
// status.export.image, pulls it over TLS and warm-starts the pod in the
// kubelet's first RunPodSandbox (which waits for the object's read): the
// counters go on from their checkpointed values, in the node's log files and
// in the log node 2's kubelet serves (what kubectl logs shows), the memory's
// md5 is the source's, and node 2's images have no name added or changed
// (issue 27). checkpointctl reads each pulled container archive; the registry
// holds the index with the documented annotations.
func TestRestoreOnAnotherNode(t *testing.T) {
	cs := needAPIServer(t)
	addr, ca := startTLSRegistry(t)
	withShimConfig(t, shimAPIConfig(node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"], addr, ca))
	apiKubelet(t, cs)
	node2Name := envOr("CRI_SHIM_NODE2_NAME", "cri-shim-node2")
	env2 := secondNode(t, cs, shimAPIConfig(filepath.Join(node2Run(), "kubelet.kubeconfig"), node2Name, addr, ca))
	pcs := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
	ns := testNamespace(t, cs, "e2e-node2")

	// The source on node 1.
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), memPod("src", node.env["NODE_NAME"], ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src := waitPod(t, cs, ns, "src", 3*time.Minute, "source Ready", podReady)
	var srcSum string
	eventually(t, 2*time.Minute, "the source's memory filled and counting", func() error {
		log := apiPodLog(node.env, ns, "src", "mem")
		s := sums(log, time.Time{})
		if len(s) == 0 {
			return fmt.Errorf("no sum logged yet")
		}
		if b, _ := os.ReadFile(log); !strings.Contains(string(b), " len="+strconv.Itoa(memMiB()<<20)) {
			return fmt.Errorf("mem did not log len=%d", memMiB()<<20)
		}
		srcSum = s[0]
		for _, c := range []string{"mem", "counter"} {
			if n := lastCounter(t, apiPodLog(node.env, ns, "src", c)); n < 20 {
				return fmt.Errorf("%s at %d", c, n)
			}
		}
		return nil
	})
	before := map[string]int{}
	for _, c := range []string{"mem", "counter"} {
		before[c] = lastCounter(t, apiPodLog(node.env, ns, "src", c))
	}

	// Checkpoint on node 1, exported to the TLS registry.
	pc := newPodCheckpoint(ns, "cp", "src", 300)
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: addr + "/e2e/node2-" + ns + ":v1"}
	t0 := time.Now()
	if _, err := pcs.Create(ctxT(t, 10*time.Second), pc); err != nil {
		t.Fatal(err)
	}
	done := waitCheckpoint(t, pcs, ns, "cp", cpv1.ReasonCompleted, 5*time.Minute)
	checkpointTook := time.Since(t0)
	after := map[string]int{}
	for _, c := range []string{"mem", "counter"} {
		after[c] = lastCounter(t, apiPodLog(node.env, ns, "src", c))
	}
	if done.Status.NodeName != node.env["NODE_NAME"] || done.Status.SourcePodUID == nil || *done.Status.SourcePodUID != src.UID {
		t.Fatalf("status node %q, source UID %v", done.Status.NodeName, done.Status.SourcePodUID)
	}
	t1 := time.Now()
	exported := waitExported(t, pcs, ns, "cp", cpv1.ReasonExported)
	pushTook := time.Since(t1)
	ex := exported.Status.Export
	if ex == nil || !strings.HasPrefix(ex.Image, addr+"/e2e/node2-"+ns+"@sha256:") || !strings.HasSuffix(ex.Image, ex.Digest) {
		t.Fatalf("status.export %+v", ex)
	}
	t.Logf("checkpoint on %s: %d MiB, Ready %.1fs after the object was created; Exported %.1fs after Ready was seen; node 1's push: %s",
		done.Status.NodeName, done.Status.SizeBytes>>20, checkpointTook.Seconds(), pushTook.Seconds(), shimLogLine(t, "podcheckpoint: exported", ex.Image))

	// The registry holds the index with the documented annotations.
	_, desc, containerName := tlsRegistryIndex(t, addr+"/e2e/node2-"+ns+":v1", ca)
	if desc.Digest.String() != ex.Digest || desc.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("the registry's tag: %s %s, status.export.digest %s", desc.MediaType, desc.Digest, ex.Digest)
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	a := im.Annotations
	for k, want := range map[string]string{ociartifact.AnnotationFormat: ociartifact.FormatName, ociartifact.AnnotationFormatVersion: strconv.Itoa(layout.Version),
		ociartifact.AnnotationPodName: "src", ociartifact.AnnotationPodNamespace: ns, ociartifact.AnnotationPodUID: string(src.UID)} {
		if a[k] != want {
			t.Errorf("index annotation %s = %q, want %q", k, a[k], want)
		}
	}
	if at, err := time.Parse(time.RFC3339, a[ociartifact.AnnotationCheckpointedAt]); err != nil || at.Before(t0.Add(-time.Minute)) || at.After(time.Now()) {
		t.Errorf("index annotation %s = %q (%v)", ociartifact.AnnotationCheckpointedAt, a[ociartifact.AnnotationCheckpointedAt], err)
	}
	ctrs := strings.Split(a[ociartifact.AnnotationContainers], ",")
	if sorted := slices.Sorted(slices.Values(ctrs)); !slices.Equal(sorted, []string{"counter", "mem"}) {
		t.Errorf("index annotation %s = %q, want mem and counter", ociartifact.AnnotationContainers, a[ociartifact.AnnotationContainers])
	}
	roles := map[string]int{}
	for _, d := range im.Manifests {
		role := d.Annotations[ociartifact.AnnotationRole]
		roles[role]++
		if role != ociartifact.RoleContainer {
			continue
		}
		c := d.Annotations[ociartifact.AnnotationContainer]
		if got, err := containerName(d.Digest.String()); err != nil || got != c {
			t.Errorf("container image %s: %s = %q (%v)", c, ociartifact.AnnotationCRIUContainerName, got, err)
		}
	}
	if roles[ociartifact.RolePod] != 1 || roles[ociartifact.RoleContainer] != 2 || len(roles) != 2 {
		t.Errorf("index descriptors by role: %v, want one pod and two containers", roles)
	}
	t.Logf("registry index %s: %v", ex.Digest, a)

	// Restore on node 2 by the PodCheckpoint's name.
	images := imagesSnapshotOn(t, env2["SHIM_SOCK"])
	t2 := time.Now()
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), memPod("restored", node2Name, "cp"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cs.CoreV1().Pods(ns).Delete(ctx, "restored", metav1.DeleteOptions{})
	})
	restored := waitPod(t, cs, ns, "restored", 4*time.Minute, "restored Running on node 2", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodRunning {
			var why []string
			for _, c := range p.Status.ContainerStatuses {
				if w := c.State.Waiting; w != nil {
					why = append(why, c.Name+": "+w.Reason+": "+w.Message)
				}
			}
			return fmt.Errorf("phase %s %v", p.Status.Phase, why)
		}
		return nil
	})
	running := time.Now()
	var pull struct {
		Time    time.Time
		Bytes   int64
		Seconds float64
	}
	if err := json.Unmarshal([]byte(shimLogLineIn(t, env2["NODE_RUN"], "pulled for a restore", ex.Image)), &pull); err != nil {
		t.Fatal(err)
	}
	pullStart := pull.Time.Add(-time.Duration(pull.Seconds * float64(time.Second)))
	t.Logf("restored on %s: Running %.1fs after the pod was created: node 2's pull of %d MiB began after %.1fs (the first RunPodSandbox, which waited for the object's read), took %.2fs; Running %.1fs after the pull",
		restored.Spec.NodeName, running.Sub(t2).Seconds(), pull.Bytes>>20, pullStart.Sub(t2).Seconds(), pull.Seconds, running.Sub(pull.Time).Seconds())
	// The first RunPodSandbox waited for node 2's read of the object
	// ([checkpoint] object_wait, 5 s by default) and for the pull, and
	// succeeded: the pull began long before the kubelet's retry of a
	// refused call (11-13 s after it, 10.9-13.4 s before the wait), and
	// neither the kubelet nor the shim reported a refusal.
	if began := pullStart.Sub(t2); began > 8*time.Second {
		t.Errorf("node 2's pull began %.1fs after the pod was created: the first RunPodSandbox was refused, the kubelet's retry pulled", began.Seconds())
	}
	evs, err := cs.CoreV1().Events(ns).List(ctxT(t, 10*time.Second), metav1.ListOptions{FieldSelector: "involvedObject.name=restored"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		switch e.Reason {
		case "FailedCreatePodSandBox", "CheckpointNotReady", "CheckpointWrongNode":
			t.Errorf("a RunPodSandbox of the restored pod was refused: %s: %s", e.Reason, e.Message)
		}
	}
	ids := map[string]string{}
	for _, s := range restored.Status.ContainerStatuses {
		ids[s.Name] = strings.TrimPrefix(s.ContainerID, "containerd://")
	}

	// The counters go on from their checkpointed values. containerd's
	// restore starts the new log with the checkpointed container's log
	// (container.log of the archive), so the file is one sequence from 0;
	// what the restored process wrote comes after the pod was created.
	for _, c := range []string{"mem", "counter"} {
		var got []int
		first := -1
		eventually(t, 30*time.Second, c+" counting on node 2", func() error {
			if got, first = countersSince(t, apiPodLog(env2, ns, "restored", c), t2); first < 0 || got[len(got)-1] < first+5 {
				return fmt.Errorf("%d numbers logged, first after the restore %d", len(got), first)
			}
			return nil
		})
		if first < before[c] || first > after[c]+1 {
			t.Errorf("%s: the restored process logged %d first; the source was at %d before the checkpoint and %d when it was Ready", c, first, before[c], after[c])
		}
		for i := 1; i < len(got); i++ {
			if got[i] != got[i-1]+1 {
				t.Errorf("%s: the restored log jumps from %d to %d", c, got[i-1], got[i])
				break
			}
		}
		t.Logf("%s: %d before the checkpoint, %d when Ready; on node 2 it went on from %d to %d", c, before[c], after[c], first, got[len(got)-1])
	}
	// The log node 2's kubelet serves, what kubectl logs shows, the same.
	for _, c := range []string{"mem", "counter"} {
		podLogShowsCounter(t, env2, ns, "restored", c, t2, before[c], after[c])
	}
	assertNoImageChangeOn(t, env2["SHIM_SOCK"], images, "the restore on node 2 of "+ns+"/restored from "+ex.Image)

	// The memory is the source's: its md5, computed by the restored process.
	asked := time.Now()
	mustCrictl(t, env2["SHIM_SOCK"], "exec", ids["mem"], "touch", "/tmp/sum")
	eventually(t, time.Minute, "the restored mem container printing its memory's md5", func() error {
		s := sums(apiPodLog(env2, ns, "restored", "mem"), asked)
		if len(s) == 0 {
			return fmt.Errorf("no sum logged yet")
		}
		if s[len(s)-1] != srcSum {
			t.Fatalf("restored memory md5 %s, the source's %s", s[len(s)-1], srcSum)
		}
		return nil
	})
	t.Logf("%d MiB of memory restored on node 2: md5 %s, as the source's", memMiB(), srcSum)

	// Node 2 holds no template: its view of the object carries no pod
	// spec, and a pod whose spec differs is refused by status.podSpecDigest
	// alone, naming the digest, before anything is pulled for it.
	nodeViewHasNoPodSpec(t, filepath.Join(node2Run(), "kubelet.kubeconfig"), ns, "cp", "/dev/urandom | base64")
	mis := memPod("mismatch", node2Name, "cp")
	mis.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "DIFFERS", Value: "1"}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), mis, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cs.CoreV1().Pods(ns).Delete(ctx, "mismatch", metav1.DeleteOptions{})
	})
	if msg := reasonEvent(t, cs, ns, "mismatch", "PodSpecMismatch"); !strings.Contains(msg, exported.Status.PodSpecDigest) {
		t.Errorf("node 2's PodSpecMismatch does not name status.podSpecDigest %s: %s", exported.Status.PodSpecDigest, msg)
	} else {
		t.Logf("node 2 refused the differing pod: %s", msg)
	}
	if p, err := cs.CoreV1().Pods(ns).Get(ctxT(t, 10*time.Second), "mismatch", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if p.Status.Phase != corev1.PodPending {
		t.Errorf("the differing pod is %s, want Pending", p.Status.Phase)
	}

	// checkpointctl reads each container's archive as node 2 pulled it.
	pulled := filepath.Join(env2["CHECKPOINTS"], layout.PulledDir(strings.TrimPrefix(ex.Digest, "sha256:")))
	m, err := layout.ReadManifest(pulled)
	if err != nil {
		t.Fatalf("pulled checkpoint on node 2: %v", err)
	}
	for _, c := range ctrs {
		archive := filepath.Join(pulled, layout.ArchiveName(c))
		b, err := exec.Command(bin("checkpointctl"), "inspect", archive).CombinedOutput()
		if err != nil {
			t.Fatalf("checkpointctl inspect %s: %v\n%s", archive, err, b)
		}
		fi, _ := os.Stat(archive)
		t.Logf("checkpointctl inspect %s (%d MiB):\n%s", archive, fi.Size()>>20, lastLines(string(b), 20))
	}
	t.Logf("pulled checkpoint: %d MiB in %s", m.SizeBytes>>20, pulled)
}
