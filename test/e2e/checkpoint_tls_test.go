package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startTLSRegistry starts the stack's registry over TLS (certificate signed
// by the test CA) once; it returns its address and the CA file.
func startTLSRegistry(t testing.TB) (addr, ca string) {
	t.Helper()
	node.registryTLSOnce.Do(func() { node.registryTLSErr = script("up.sh", "--start", "registry-tls") })
	if node.registryTLSErr != nil {
		t.Fatalf("TLS registry: %v", node.registryTLSErr)
	}
	return node.env["REGISTRY_TLS_ADDR"], filepath.Join(node.env["PKI"], "ca.crt")
}

// Issue 17 over TLS: a pod checkpoint pushed to a registry that serves HTTPS
// with a certificate of the node's CA (the CLI trusts it through --ca-file,
// and refuses it without), then restored by a static pod whose restore-from
// is the image reference: the shim pulls it through its allow-list entry
// with ca_file, and the pod comes up with its counters resumed.
func TestRestoreThroughTLSRegistry(t *testing.T) {
	needKubelet(t)
	addr, ca := startTLSRegistry(t)
	const cp = "e2e-tls-src"
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp))
	t.Cleanup(func() { os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], cp)) })
	name := fmt.Sprintf("tls-src-%d", time.Now().Unix()%100000)
	placeManifest(t, name, warmPodManifest(name, ""))
	waitRunning(t, name, 90*time.Second, 0, "sidecar", "main")
	src := fullName(name)
	eventually(t, 30*time.Second, "source counting to 30", func() error {
		if n := lastCounter(t, podLog(t, src, "main")); n < 30 {
			return fmt.Errorf("main at %d", n)
		}
		return nil
	})
	shim := func(args ...string) (string, error) {
		out, err := exec.Command(node.env["SHIM_BIN"], append(args, "--config", node.env["SHIM_CONFIG"])...).CombinedOutput()
		return string(out), err
	}
	// Read before the checkpoint (the cut is later): read after it, the
	// source has counted on past the cut while the command finished, and a
	// restore that goes on from the cut looked "from scratch".
	before := lastCounter(t, podLog(t, src, "main"))
	if out, err := shim("checkpoint", "--namespace", "default", "--pod", src, "--name", cp, "--timeout", "60s"); err != nil {
		t.Fatalf("cri-shim checkpoint: %v\n%s", err, out)
	}
	checkpointed := time.Now()

	ref := addr + "/e2e/tls-pod:v1"
	if out, err := shim("checkpoint", "push", cp, ref); err == nil || !strings.Contains(out, "certificate") {
		t.Fatalf("push without the CA: %v\n%s\nwant a refused certificate", err, out)
	}
	b, err := exec.Command(node.env["SHIM_BIN"], "checkpoint", "push", cp, ref, "--ca-file", ca, "-o", "json", "--config", node.env["SHIM_CONFIG"]).Output()
	out := string(b)
	if err != nil {
		t.Fatalf("push with the CA: %v\n%s", err, out)
	}
	var pushed struct{ Ref string }
	if err := json.Unmarshal([]byte(out), &pushed); err != nil || !strings.Contains(pushed.Ref, "@sha256:") {
		t.Fatalf("push -o json: %v: %q", err, out)
	}
	t.Logf("pushed over TLS: %s", pushed.Ref)

	withShimConfig(t, fmt.Sprintf("[[checkpoint.registries]]\nhost = %q\nnamespaces = [\"*\"]\nanonymous_push = true\nca_file = %q\n", addr, ca))
	images := imagesSnapshot(t) // after the pushes
	dst := fmt.Sprintf("tls-dst-%d", time.Now().Unix()%100000)
	placeManifest(t, dst, warmPodManifest(dst, pushed.Ref))
	t0 := time.Now()
	waitRunning(t, dst, 3*time.Minute, 0, "sidecar", "main")
	t.Logf("restored from the TLS registry: Running %.1fs after the manifest was placed", time.Since(t0).Seconds())
	_, first := countersLoggedSince(t, func() string { return podLog(t, fullName(dst), "main") }, checkpointed)
	if first < before {
		t.Fatalf("the restored main logged %d first; the source was at %d before the checkpoint (started from scratch?)", first, before)
	}
	assertNoImageChange(t, images, "the restore of "+dst+" from "+pushed.Ref)
}
