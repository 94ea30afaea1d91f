package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
)

// secretPod is a static pod in namespace ns whose only container makes up a
// random secret at start, keeps it in its memory (a shell variable, in no
// file, spec or argument) and logs "secret=<it> n=<counter>" every 100 ms.
// restoreFrom, when set, names the checkpoint to warm-start from.
func secretPod(name, ns, restoreFrom string) string {
	return mainPod(name, ns, restoreFrom, `["sh", "-c", "S=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'); i=0; while true; do echo secret=$S n=$i; i=$((i+1)); sleep 0.1; done"]`)
}

// mainPod is a static pod ns/name with one busybox container, main, running
// command (a YAML flow sequence); restoreFrom, when set, names the
// checkpoint to warm-start from.
func mainPod(name, ns, restoreFrom, command string) string {
	ann := ""
	if restoreFrom != "" {
		ann = fmt.Sprintf("  annotations:\n    %s: %q\n", podspec.RestoreFromKey, restoreFrom)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
%sspec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:cri-shim
    imagePullPolicy: Never
    command: %s
`, name, ns, ann, command)
}

var secretLine = regexp.MustCompile(`secret=([0-9a-f]{32}) n=(\d+)`)

// secretLog is what a pod's main container logged: every secret seen and the
// last counter; "" and -1 while it has no log.
func secretLog(t testing.TB, ns, pod string) (secrets map[string]bool, last int, raw string) {
	t.Helper()
	secrets, last = map[string]bool{}, -1
	files, _ := filepath.Glob(filepath.Join(node.env["NODE_DATA"], "pod-logs", ns+"_"+pod+"_*", "main", "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		raw += string(b)
	}
	for _, m := range secretLine.FindAllStringSubmatch(raw, -1) {
		secrets[m[1]] = true
		if n, err := strconv.Atoi(m[2]); err == nil {
			last = n
		}
	}
	return secrets, last, raw
}

// sandboxesIn lists the runtime's sandboxes of namespace ns, asked of
// containerd directly (not through the shim).
func sandboxesIn(t testing.TB, ns string) []*runtimeapi.PodSandbox {
	t.Helper()
	r, err := runtimeClient(t, node.env["CONTAINERD_SOCK"]).ListPodSandbox(ctxT(t, 10*time.Second), &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns}}})
	if err != nil {
		t.Fatal(err)
	}
	return r.Items
}

// Issue 14 item 1, with a standalone kubelet v1.36: a checkpoint of a pod in
// namespace e2e-ns-a restores its memory (the secret the process made up)
// into a pod of e2e-ns-a; a pod of e2e-ns-b naming the same checkpoint stays
// Pending with the rule's message, its sandbox is never created, no byte of
// the secret appears anywhere in its logs, and RestorePod into e2e-ns-b is
// refused with the answer a missing checkpoint gets. An operator's
// allow-list entry (e2e-ns-a to e2e-ns-c) opens exactly that pair.
func TestWarmStartStaysInItsNamespace(t *testing.T) {
	needKubelet(t)
	const cp, nsA, nsB, nsC = "e2e-ns-binding", "e2e-ns-a", "e2e-ns-b", "e2e-ns-c"
	klog := filepath.Join(node.env["NODE_RUN"], "kubelet.log")
	var klogFrom int64 // only what the kubelet logs during this test
	if fi, err := os.Stat(klog); err == nil {
		klogFrom = fi.Size()
	}
	dir := filepath.Join(node.env["CHECKPOINTS"], cp)
	os.RemoveAll(dir)
	t.Cleanup(func() { os.RemoveAll(dir) })

	placeManifest(t, "ns-src", secretPod("ns-src", nsA, ""))
	waitRunning(t, "ns-src", 90*time.Second, 0, "main")
	src := fullName("ns-src")
	secret := loggedSecret(t, nsA, src, 20)
	_, before, _ := secretLog(t, nsA, src) // the checkpoint is taken after this
	images := imagesSnapshot(t)
	out, err := exec.Command(node.env["SHIM_BIN"], "checkpoint", "--config", node.env["SHIM_CONFIG"],
		"--namespace", nsA, "--pod", src, "--name", cp, "--timeout", "60s").CombinedOutput()
	if err != nil {
		t.Fatalf("cri-shim checkpoint: %v\n%s", err, out)
	}
	t.Logf("checkpoint %s of %s/%s taken with its counter past %d", cp, nsA, src, before)

	// The same name in two namespaces: only the checkpoint's own warm-starts.
	placeManifest(t, "ns-same", secretPod("ns-same", nsA, cp))
	placeManifest(t, "ns-foreign", secretPod("ns-foreign", nsB, cp))
	waitRunning(t, "ns-same", 120*time.Second, 0, "main")
	same := fullName("ns-same")
	eventually(t, 20*time.Second, "the warm-started pod logging", func() error {
		if _, last, _ := secretLog(t, nsA, same); last < 0 {
			return fmt.Errorf("no counter yet")
		}
		return nil
	})
	s, last, raw := secretLog(t, nsA, same)
	if !s[secret] || len(s) != 1 {
		t.Fatalf("the same-namespace warm start did not restore the memory: secrets %v, want only %s\n%s", s, secret, lastLines(raw, 5))
	}
	if last < before { // the counter goes on from the checkpoint, not from 0
		t.Fatalf("the same-namespace warm start is at %d; the source was past %d before the checkpoint", last, before)
	}
	t.Logf("same namespace: restored secret %s…, counter at %d", secret[:6], last)
	assertNoImageChange(t, images, "the warm start of "+same)

	foreign := fullName("ns-foreign")
	// refusals are the kubelet's log lines about the refused sandbox of
	// foreign; attempts counts its tries (its pod worker retries a failed
	// sync), one "CreatePodSandbox for pod failed" line each.
	refusals := func() (lines []string, attempts int) {
		b, _ := os.ReadFile(klog)
		if int64(len(b)) < klogFrom {
			klogFrom = 0 // a new kubelet log
		}
		for _, l := range strings.Split(string(b[klogFrom:]), "\n") {
			if strings.Contains(l, foreign) && strings.Contains(l, "own namespace") {
				lines = append(lines, l)
				if strings.Contains(l, "CreatePodSandbox for pod failed") {
					attempts++
				}
			}
		}
		return lines, attempts
	}
	var refusal string
	eventually(t, 60*time.Second, "the kubelet reporting the refusal of "+foreign, func() error {
		if fs, last, _ := secretLog(t, nsB, foreign); fs[secret] {
			t.Fatalf("%s (namespace %s) runs the process restored from %s's checkpoint: it logs %s's secret (counter %d)", foreign, nsB, nsA, nsA, last)
		}
		if r, _ := refusals(); len(r) > 0 {
			refusal = r[0]
			return nil
		}
		return fmt.Errorf("no refusal in kubelet.log yet")
	})
	t.Logf("kubelet: %s", refusal)
	// The kubelet tries the foreign pod's sandbox again (its pod worker's
	// backoff after a failed sync) and is refused again: after that retry
	// the pod is still Pending, was never given a sandbox, and logged nothing.
	eventually(t, 60*time.Second, "the kubelet's retry of "+foreign+"'s sandbox refused too", func() error {
		if _, n := refusals(); n < 2 {
			return fmt.Errorf("%d refused attempts in kubelet.log", n)
		}
		return nil
	})
	lines, _ := refusals()
	for _, l := range lines {
		for _, leak := range []string{nsA, src, secret, "busybox", dir} {
			if strings.Contains(l, leak) {
				t.Errorf("the refusal seen by %s tells %q of the checkpoint: %s", nsB, leak, l)
			}
		}
	}
	p, err := kubeletPod(t, foreign)
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || statusOf(p, "main") != nil && statusOf(p, "main").State.Running != nil {
		t.Fatalf("%s is %s: %+v, want Pending and not running", foreign, p.Status.Phase, p.Status.ContainerStatuses)
	}
	if sbs := sandboxesIn(t, nsB); len(sbs) != 0 {
		t.Fatalf("the runtime created %d sandbox(es) for %s", len(sbs), nsB)
	}
	if fs, _, raw := secretLog(t, nsB, foreign); len(fs) != 0 || raw != "" {
		t.Fatalf("%s logged %q", foreign, lastLines(raw, 3))
	}
	assertNoSecret(t, filepath.Join(node.env["NODE_DATA"], "pod-logs"), nsB, secret)

	// RestorePod through the shim's socket into e2e-ns-b: the answer of a
	// missing checkpoint, and nothing is created.
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	restore := func(path string) error {
		cfg := sandboxCfg("ns-restore", "ns-restore-uid", t.TempDir())
		cfg.Metadata.Namespace = nsB
		cfg.Labels["io.kubernetes.pod.namespace"] = nsB
		c := counterCfg("main")
		_, err := rt.RestorePod(ctxT(t, time.Minute), &runtimeapi.RestorePodRequest{CheckpointPath: path, Config: cfg,
			ContainerConfigs: []*runtimeapi.ContainerConfig{c}})
		return err
	}
	errForeign, errMissing := restore(dir), restore(filepath.Join(node.env["CHECKPOINTS"], cp+"-absent"))
	if status.Code(errForeign) != codes.NotFound || errForeign.Error() != errMissing.Error() {
		t.Fatalf("RestorePod into %s: %v\nmissing checkpoint: %v\nwant the same NotFound", nsB, errForeign, errMissing)
	}
	if sbs := sandboxesIn(t, nsB); len(sbs) != 0 {
		t.Fatalf("RestorePod created %d sandbox(es) in %s", len(sbs), nsB)
	}
	assertNoImageChange(t, images, "the refused warm start of "+foreign+" and the refused RestorePod calls")

	// The operator allows e2e-ns-a to e2e-ns-c: a pod there warm-starts with
	// the secret, and e2e-ns-b is still refused.
	withShimConfig(t, fmt.Sprintf("[[checkpoint.restore_namespace_allow]]\nfrom = %q\nto = %q\n", nsA, nsC))
	placeManifest(t, "ns-allowed", secretPod("ns-allowed", nsC, cp))
	waitRunning(t, "ns-allowed", 120*time.Second, 0, "main")
	allowed := fullName("ns-allowed")
	eventually(t, 20*time.Second, "the allowed pod logging the secret", func() error {
		if s, _, _ := secretLog(t, nsC, allowed); !s[secret] {
			return fmt.Errorf("secrets %v", s)
		}
		return nil
	})
	if p, err := kubeletPod(t, foreign); err != nil || p.Status.Phase != corev1.PodPending || len(sandboxesIn(t, nsB)) != 0 {
		t.Fatalf("%s after the allow-list of another pair: %v %v", foreign, p.Status.Phase, err)
	}
	assertNoSecret(t, filepath.Join(node.env["NODE_DATA"], "pod-logs"), nsB, secret)
	assertNoImageChange(t, images, "the warm start of "+allowed)
}

// assertNoSecret fails if any file of namespace ns under dir holds the
// secret, or any 4-byte piece of it (8 hex digits).
func assertNoSecret(t testing.TB, dir, ns, secret string) {
	t.Helper()
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || !strings.Contains(p, "/"+ns+"_") {
			return nil
		}
		b, _ := os.ReadFile(p)
		for i := 0; i+8 <= len(secret); i += 8 {
			if strings.Contains(string(b), secret[i:i+8]) {
				t.Fatalf("%s holds part of the secret of a pod of another namespace", p)
			}
		}
		return nil
	})
}
