package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// shimAsNodeWithRegistry is shimAsNode with the loopback registry in the
// shim's allow-list; it returns the clients and the registry's address.
func shimAsNodeWithRegistry(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	cs := needAPIServer(t)
	addr := startRegistry(t)
	withShimConfig(t, plainRegistryConfig(addr))
	apiKubelet(t, cs)
	return cs, addr
}

// plainRegistryConfig is the [kubernetes] section of a shim talking to the
// API as its node, and an allow-list entry for the plain-HTTP loopback
// registry addr.
func plainRegistryConfig(addr string) string {
	return fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n\n[[checkpoint.registries]]\nhost = %q\nnamespaces = [\"*\"]\nanonymous_push = true\nplain_http = true\n",
		node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"], addr)
}

// bigSecretAPIPod is secretAPIPod writing 160 MiB of random data into its
// writable layer first, so its checkpoint is as large as
// TestCheckpointPushPullRestore's.
func bigSecretAPIPod(name, restoreFrom string) *corev1.Pod {
	return blobSecretAPIPod(name, restoreFrom, 160)
}

// blobSecretAPIPod is secretAPIPod writing mib MiB of random data into its
// writable layer first: its checkpoint's archive holds them (in
// rootfs-diff.tar, which cannot compress them).
func blobSecretAPIPod(name, restoreFrom string, mib int) *corev1.Pod {
	p := secretAPIPod(name, restoreFrom)
	c := &p.Spec.Containers[0]
	c.Command[len(c.Command)-1] = fmt.Sprintf("dd if=/dev/urandom of=/tmp/blob bs=1048576 count=%d 2>/dev/null; ", mib) + c.Command[len(c.Command)-1]
	return p
}

// withPullSecret is p naming the image pull secret secret.
func withPullSecret(p *corev1.Pod, secret string) *corev1.Pod {
	p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: secret}}
	return p
}

// dockerConfigSecret creates the kubernetes.io/dockerconfigjson secret
// ns/name holding the docker config.json cfg.
func dockerConfigSecret(t *testing.T, cs kubernetes.Interface, ns, name string, cfg []byte) {
	t.Helper()
	if _, err := cs.CoreV1().Secrets(ns).Create(ctxT(t, 10*time.Second), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// shimLogLine returns the fields of the shim's last log line with msg that
// mentions what.
func shimLogLine(t *testing.T, msg, what string) string {
	t.Helper()
	return shimLogLineIn(t, node.env["NODE_RUN"], msg, what)
}

// shimLogLineIn is shimLogLine for the node whose $NODE_RUN is run.
func shimLogLineIn(t *testing.T, run, msg, what string) string {
	t.Helper()
	l := lastShimLogLine(t, run, msg, what)
	if l == "" {
		t.Fatalf("no shim log line %q about %s", msg, what)
	}
	return l
}

// lastShimLogLine is the last line of the shim's log on the node whose
// $NODE_RUN is run with msg that mentions what, or "" if there is none.
func lastShimLogLine(t *testing.T, run, msg, what string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run, "cri-shim.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], msg) && strings.Contains(lines[i], what) {
			return lines[i]
		}
	}
	return ""
}

// runningSecret waits for ns/name to run and log one secret, and returns it.
func runningSecret(t *testing.T, cs kubernetes.Interface, ns, name string, timeout time.Duration) string {
	t.Helper()
	waitPod(t, cs, ns, name, timeout, name+" Running", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	return loggedSecret(t, ns, name, 5)
}

// restoredWithSecret waits for ns/pod to run and fails the test unless it
// logs secret, its source's: it runs the checkpointed process; and unless
// the kubelet's log (what kubectl logs shows) has that process counting on.
func restoredWithSecret(t *testing.T, cs kubernetes.Interface, ns, pod, secret string) {
	t.Helper()
	if got := runningSecret(t, cs, ns, pod, 3*time.Minute); got != secret {
		t.Fatalf("%s/%s logs secret %s, the source's is %s", ns, pod, got, secret)
	}
	podLogShowsSecret(t, ns, pod, secret, -1)
}

// createPod creates pod p in namespace ns.
func createPod(t *testing.T, cs kubernetes.Interface, ns string, p *corev1.Pod) {
	t.Helper()
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// loggedSecret waits until pod ns/name has logged one secret at least n
// times and returns it.
func loggedSecret(t *testing.T, ns, name string, n int) string {
	t.Helper()
	var secret string
	eventually(t, 30*time.Second, fmt.Sprintf("%s logging its secret %d times", name, n), func() error {
		s, last, _ := secretLog(t, ns, name)
		if len(s) != 1 || last < n {
			return fmt.Errorf("secrets %v, counter %d", s, last)
		}
		for k := range s {
			secret = k
		}
		return nil
	})
	return secret
}

// pushedPod checkpoints the running pod ns/name with the CLI, pushes it to
// the loopback registry and returns the pushed reference by digest.
func pushedPod(t *testing.T, addr, ns, name, repo string) string {
	t.Helper()
	return pushedCheckpoint(t, ns, name, "e2e-img-"+strings.ReplaceAll(ns, ".", "-"), addr+"/"+repo+":v1", "--plain-http")
}

// pushedCheckpoint checkpoints the running pod ns/name with the CLI into
// checkpoint cp (removed after the test), pushes it to ref with the push's
// flags and returns the pushed reference by digest.
func pushedCheckpoint(t *testing.T, ns, name, cp, ref string, flags ...string) string {
	t.Helper()
	shimRun(t, "checkpoint", "--namespace", ns, "--pod", name, "--name", cp)
	t.Cleanup(func() { os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp)) })
	return pushCheckpoint(t, cp, ref, flags...)
}

// pushCheckpoint pushes checkpoint cp to ref with the push's flags and
// returns the pushed reference by digest.
func pushCheckpoint(t *testing.T, cp, ref string, flags ...string) string {
	t.Helper()
	out, _, _ := shimRun(t, append([]string{"checkpoint", "push", cp, ref, "-o", "json"}, flags...)...)
	var pushed struct{ Ref string }
	if err := json.Unmarshal([]byte(out), &pushed); err != nil || !strings.Contains(pushed.Ref, "@sha256:") {
		t.Fatalf("push -o json: %v: %q", err, out)
	}
	return pushed.Ref
}

// Issue 17, item 2, on the real node: a pod whose restore-from is an image
// reference by digest comes up with the checkpointed process (the node pulls
// it into oci-<digest>, reading the pod's image pull secrets as the node),
// counting on in the kubelet's log (what kubectl logs shows), no image name
// added (issue 27); a pod of another namespace naming it and a reference to a
// registry outside the allow-list stay Pending with precise events; a
// PodCheckpoint whose spec.sourceImage is the reference restores a pod by its
// name, once the registry let that pod's credentials read it, and the node
// that restored it holds it with the reference resolved and the restore
// recorded in its status (one naming an unlisted registry:
// RegistryNotAllowed); the pulled directory goes with the pods.
func TestRestoreFromImageReference(t *testing.T) {
	cs, addr := shimAsNodeWithRegistry(t)
	ns := testNamespace(t, cs, "e2e-img")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), bigSecretAPIPod("src", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := runningSecret(t, cs, ns, "src", 2*time.Minute)
	ref := pushedPod(t, addr, ns, "src", "e2e/img-"+ns)
	t.Logf("pushed %s", ref)
	_, past, _ := secretLog(t, ns, "src") // beyond the checkpointed count
	images := imagesSnapshot(t)           // after the push

	// An image pull secret the pod names is read as the node (Node authorizer).
	dockerConfigSecret(t, cs, ns, "regcred", []byte(fmt.Sprintf(`{"auths":{%q:{"username":"u","password":"p"}}}`, addr)))
	t0 := time.Now()
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), withPullSecret(bigSecretAPIPod("restored", ref), "regcred"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := runningSecret(t, cs, ns, "restored", 3*time.Minute); got != secret {
		t.Fatalf("restored pod logs secret %s, the source's is %s", got, secret)
	}
	t.Logf("restored from %s: Running with the source's memory %.1fs after it was created", ref, time.Since(t0).Seconds())
	podLogShowsSecret(t, ns, "restored", secret, past)
	assertNoImageChange(t, images, "the restore of "+ns+"/restored from "+ref)
	pulled := filepath.Join(node.env["CHECKPOINTS"], layout.PulledDir(ref[len(ref)-64:]))
	m, err := layout.ReadManifest(pulled)
	if err != nil {
		t.Fatalf("pulled checkpoint: %v", err)
	}
	t.Logf("the shim pulled %d MiB: %s", m.SizeBytes>>20, shimLogLine(t, "pulled for a restore", ref))

	// Another namespace: the binding holds for the pulled manifest.
	other := testNamespace(t, cs, "e2e-img-other")
	if _, err := cs.CoreV1().Pods(other).Create(ctxT(t, 10*time.Second), secretAPIPod("thief", ref), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("other namespace: %s", sandboxEvent(t, cs, other, "thief", "no checkpoint that a pod of namespace"))
	stillPending(t, cs, other, "thief", secret)

	// A registry outside the allow-list is never contacted.
	far := "127.0.0.2:5999/e2e/img@" + ref[strings.LastIndex(ref, "@")+1:]
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("far", far), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("registry not allowed: %s", sandboxEvent(t, cs, ns, "far", "is not in this node's [checkpoint] registries allow-list"))
	stillPending(t, cs, ns, "far", secret)

	// A PodCheckpoint naming the image is restored by name.
	pcs := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
	fromImage := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "from-img"}, Spec: cpv1.PodCheckpointSpec{SourceImage: ref}}
	if _, err := pcs.Create(ctxT(t, 10*time.Second), fromImage); err != nil {
		t.Fatal(err)
	}
	if got, err := pcs.Get(ctxT(t, 10*time.Second), ns, "from-img"); err != nil || len(got.Status.Conditions) != 0 || got.Status.NodeName != "" {
		t.Errorf("from-img before any restore from it: %+v, %v (no node holds it yet)", got.Status, err)
	}
	bad := fromImage.DeepCopy()
	bad.Name, bad.Spec.SourceImage = "by-tag", addr+"/e2e/img:v1"
	_, err = pcs.Create(ctxT(t, 10*time.Second), bad)
	wantInvalid(t, "sourceImage by tag", err, "spec.sourceImage")
	bad.Name, bad.Spec.SourceImage, bad.Spec.SourcePodName = "both", ref, "src"
	_, err = pcs.Create(ctxT(t, 10*time.Second), bad)
	wantInvalid(t, "sourceImage and sourcePodName", err, "exactly one of spec.sourcePodName and spec.sourceImage")
	t0 = time.Now()
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), bigSecretAPIPod("by-name", "from-img"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := runningSecret(t, cs, ns, "by-name", 3*time.Minute); got != secret {
		t.Fatalf("pod restored from PodCheckpoint from-img logs secret %s, the source's is %s", got, secret)
	}
	t.Logf("restored by the name of a PodCheckpoint with spec.sourceImage: Running %.1fs after it was created (the first RunPodSandbox waits for the object's read; 11.7-16.1 s, one kubelet retry, before it did)", time.Since(t0).Seconds())
	podLogShowsSecret(t, ns, "by-name", secret, past)
	// The checkpoint was pulled with the first pod's secret; this pod names
	// none, so before it restored from the copy on the node the registry was
	// asked whether the node's credentials may read it (docs/checkpoint-oci.md,
	// "A checkpoint already on the node").
	t.Logf("access checked: %s", shimLogLine(t, "the registry lets a pod read a pulled checkpoint", ns+"/by-name"))
	sourceImageStatus(t, cs, pcs, ns, "from-img", "by-name", ref)

	// An object naming a registry outside the allow-list: the node that
	// restores a pod from it holds it with the allow-list's refusal.
	farObj := fromImage.DeepCopy()
	farObj.Name, farObj.Spec.SourceImage = "far-img", far
	if _, err := pcs.Create(ctxT(t, 10*time.Second), farObj); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("far-by-name", "far-img"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	farStatus := waitCheckpoint(t, pcs, ns, "far-img", cpv1.ReasonRegistryNotAllowed, 2*time.Minute)
	if c := meta.FindStatusCondition(farStatus.Status.Conditions, cpv1.ConditionReady); c.Status != metav1.ConditionFalse ||
		!strings.Contains(c.Message, "is not in this node's [checkpoint] registries allow-list") || farStatus.Status.SourceImage != nil {
		t.Errorf("far-img: Ready %+v, status.sourceImage %+v", c, farStatus.Status.SourceImage)
	}
	stillPending(t, cs, ns, "far-by-name", secret)
	assertNoImageChange(t, images, "the restores from "+ref+", by reference and by the name of a PodCheckpoint, and the refused ones")

	// The pulled checkpoint goes with the last pod using it.
	for _, p := range []string{"restored", "by-name"} {
		if err := cs.CoreV1().Pods(ns).Delete(ctxT(t, 10*time.Second), p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 3*time.Minute, "the pulled checkpoint removed with its pod", func() error {
		if _, err := os.Stat(pulled); !os.IsNotExist(err) {
			return fmt.Errorf("%s: %v", pulled, err)
		}
		return nil
	})
}

// sourceImageStatus checks the status of ns/name, an object with
// spec.sourceImage ref that pod was restored from: held by this node,
// Ready True SourceImageResolved, the index's annotations (the source pod
// "src" of ns) and the restore recorded.
func sourceImageStatus(t *testing.T, cs kubernetes.Interface, pcs *podcheckpoint.Client, ns, name, pod, ref string) {
	t.Helper()
	got := waitCheckpoint(t, pcs, ns, name, cpv1.ReasonSourceImageResolved, 2*time.Minute)
	p, err := cs.CoreV1().Pods(ns).Get(ctxT(t, 10*time.Second), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := got.Status
	if s.NodeName != node.env["NODE_NAME"] {
		t.Errorf("%s held by %q, want this node", name, s.NodeName)
	}
	si := s.SourceImage
	if si == nil || si.Digest != ref[strings.LastIndex(ref, "@")+1:] || si.PodNamespace != ns || si.PodName != "src" ||
		si.CheckpointedAt == nil || len(si.Containers) == 0 {
		t.Errorf("%s: status.sourceImage %+v", name, si)
	}
	if lr := s.LastRestore; lr == nil || lr.PodName != pod || lr.PodUID != p.UID || lr.NodeName != node.env["NODE_NAME"] {
		t.Errorf("%s: status.lastRestore %+v, want pod %s (%s)", name, lr, pod, p.UID)
	}
	t.Logf("%s: %s", name, meta.FindStatusCondition(s.Conditions, cpv1.ConditionReady).Message)
}

// waitExported waits for the Exported condition of ns/name to have reason.
func waitExported(t *testing.T, pcs *podcheckpoint.Client, ns, name, reason string) *cpv1.PodCheckpoint {
	t.Helper()
	var pc *cpv1.PodCheckpoint
	eventually(t, 2*time.Minute, name+" Exported "+reason, func() error {
		var err error
		if pc, err = pcs.Get(ctxT(t, 10*time.Second), ns, name); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported); c == nil || c.Reason != reason {
			return fmt.Errorf("Exported %+v", c)
		}
		return nil
	})
	return pc
}

// Issue 17, item 2: a PodCheckpoint with spec.export is pushed by the node
// that holds it once Ready; status.export has the reference by digest and
// the digest, which the registry serves; a pod restored from that reference
// has the source's memory, counts on in the kubelet's log (what kubectl logs
// shows) and adds no image name (issue 27). An export to a registry outside
// the allow-list fails with why. Under restore_provenance = "cluster" a
// checkpoint no node exported is refused, also with forged export records
// (forgedRecordsRefused).
func TestPodCheckpointExport(t *testing.T) {
	cs, addr := shimAsNodeWithRegistry(t)
	// The default provenance: a restore from a reference pulls only what a
	// node of this cluster exported (issue 28, item 2).
	withShimConfigEdit(t, func(b []byte) []byte {
		return bytes.Replace(b, []byte(`restore_provenance = "any"`), []byte(`restore_provenance = "cluster"`), 1)
	})
	pcs := podCheckpoints(t, node.env["ADMIN_KUBECONFIG"])
	ns := testNamespace(t, cs, "e2e-exp")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("src", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := runningSecret(t, cs, ns, "src", 2*time.Minute)
	pc := newPodCheckpoint(ns, "cp", "src", 120)
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: addr + "/e2e/exp-" + ns + ":v1"}
	if _, err := pcs.Create(ctxT(t, 10*time.Second), pc); err != nil {
		t.Fatal(err)
	}
	far := newPodCheckpoint(ns, "far", "src", 120)
	far.Spec.Export = &cpv1.PodCheckpointExport{Image: "127.0.0.2:5999/e2e/exp:v1"}
	if _, err := pcs.Create(ctxT(t, 10*time.Second), far); err != nil {
		t.Fatal(err)
	}
	waitCheckpoint(t, pcs, ns, "cp", cpv1.ReasonCompleted, 2*time.Minute)
	_, past, _ := secretLog(t, ns, "src") // beyond the checkpointed count
	t0 := time.Now()
	got := waitExported(t, pcs, ns, "cp", cpv1.ReasonExported)
	s := got.Status.Export
	if s == nil || !strings.HasPrefix(s.Image, addr+"/e2e/exp-"+ns+"@sha256:") || !strings.HasSuffix(s.Image, s.Digest) || s.CompletionTime == nil {
		t.Fatalf("status.export %+v", s)
	}
	t.Logf("exported %s (%d bytes) within %.1fs of being seen Ready", s.Image, got.Status.SizeBytes, time.Since(t0).Seconds())
	r, err := name.ParseReference(addr+"/e2e/exp-"+ns+":v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := remote.Get(r); err != nil || d.Digest.String() != s.Digest {
		t.Fatalf("the registry's tag: %v %v, status digest %s", d, err, s.Digest)
	}
	reasonEvent(t, cs, ns, "cp", "ExportSucceeded")

	images := imagesSnapshot(t) // after the export's push
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("restored", s.Image), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := runningSecret(t, cs, ns, "restored", 3*time.Minute); got != secret {
		t.Fatalf("pod restored from the export logs %s, the source's is %s", got, secret)
	}
	podLogShowsSecret(t, ns, "restored", secret, past)
	assertNoImageChange(t, images, "the restore of "+ns+"/restored from the export "+s.Image)

	waitCheckpoint(t, pcs, ns, "far", cpv1.ReasonCompleted, 2*time.Minute)
	f := waitExported(t, pcs, ns, "far", cpv1.ReasonExportFailed)
	if c := meta.FindStatusCondition(f.Status.Conditions, cpv1.ConditionExported); !strings.Contains(c.Message, "is not in this node's [checkpoint] registries allow-list") {
		t.Errorf("export to an unlisted registry: %+v", c)
	} else {
		t.Logf("unlisted registry: %s", c.Message)
	}

	// The same pod pushed by hand (no PodCheckpoint records it; after the
	// objects' checkpoints, which it would otherwise collide with): refused
	// before anything is pulled.
	unexported := pushedPod(t, addr, ns, "src", "e2e/unexported-"+ns)
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), secretAPIPod("unexported", unexported), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("not exported by the cluster: %s", sandboxEvent(t, cs, ns, "unexported", "records exporting"))
	stillPending(t, cs, ns, "unexported", secret)
	if _, err := os.Stat(filepath.Join(node.env["CHECKPOINTS"], layout.PulledDir(unexported[len(unexported)-64:]))); !os.IsNotExist(err) {
		t.Errorf("the unexported checkpoint was pulled: %v", err)
	}
	forgedRecordsRefused(t, cs, pcs, addr, ns, unexported, secret)
}
