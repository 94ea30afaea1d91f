package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// startAuthRegistry starts the stack's registry that wants a login (over
// TLS, certificate of the test CA; up.sh --start registry-auth) once; it
// returns its address, the CA file, and the docker config.json with the
// login of each of its users, user1 and user2.
func startAuthRegistry(t testing.TB) (addr, ca string, logins map[string]string) {
	t.Helper()
	node.registryAuthOnce.Do(func() { node.registryAuthErr = script("up.sh", "--start", "registry-auth") })
	if node.registryAuthErr != nil {
		t.Fatalf("registry with a login: %v", node.registryAuthErr)
	}
	logins = map[string]string{}
	for _, u := range []string{"user1", "user2"} {
		logins[u] = filepath.Join(node.env["REGISTRY_AUTH_DIR"], u+".json")
	}
	return node.env["REGISTRY_AUTH_ADDR"], filepath.Join(node.env["PKI"], "ca.crt"), logins
}

// A checkpoint already on the node is answered to a pod only if the
// registry lets that pod's credentials read it (docs/checkpoint-oci.md, "A
// checkpoint already on the node"), against a registry that wants a login:
// a pod checkpoint pushed with user1's login (refused without one) is pulled
// for pod "a", whose image pull secret has user1's login; pod "b" of the same
// namespace names the same reference with user1's name and a wrong password
// and stays Pending with PermissionDenied and the registry's 401, though the
// checkpoint is on the node; pod "c", with a's secret, restores from the
// copy on the node without asking the registry (its credential is recorded),
// and pod "d", with user2's login, after the registry served one GET of
// the index (logged). Neither c nor d pulls it again. The kubelet's log
// (what kubectl logs shows) has each restored process counting on, and no
// image name is added (issue 27).
func TestRestoreThroughAuthRegistry(t *testing.T) {
	cs := needAPIServer(t)
	addr, ca, logins := startAuthRegistry(t)
	withShimConfig(t, shimAPIConfig(node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"], addr, ca))
	apiKubelet(t, cs)
	ns := testNamespace(t, cs, "e2e-auth")
	createPod(t, cs, ns, secretAPIPod("src", ""))
	secret := runningSecret(t, cs, ns, "src", 2*time.Minute)
	cp := "e2e-auth-" + ns
	ref := pushedCheckpoint(t, ns, "src", cp, addr+"/e2e/auth-"+ns+":v1", "--registry-config", logins["user1"], "--ca-file", ca)
	t.Logf("pushed with user1's login: %s", ref)
	// Without a login (root's docker config has none for it) the registry refuses.
	out, err := exec.Command(node.env["SHIM_BIN"], "checkpoint", "push", cp, addr+"/e2e/auth-"+ns+":anonymous",
		"--ca-file", ca, "--config", node.env["SHIM_CONFIG"]).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "401 Unauthorized") {
		t.Fatalf("push without a login: %v\n%s\nwant the registry's 401 Unauthorized", err, out)
	}

	user1, err := os.ReadFile(logins["user1"])
	if err != nil {
		t.Fatal(err)
	}
	user2, err := os.ReadFile(logins["user2"])
	if err != nil {
		t.Fatal(err)
	}
	dockerConfigSecret(t, cs, ns, "login1", user1)
	dockerConfigSecret(t, cs, ns, "login2", user2)
	dockerConfigSecret(t, cs, ns, "wrong", []byte(fmt.Sprintf(`{"auths":{%q:{"username":"user1","password":"not-the-password"}}}`, addr)))
	images := imagesSnapshot(t) // after the pushes

	restore := func(pod, pullSecret string) { createPod(t, cs, ns, withPullSecret(secretAPIPod(pod, ref), pullSecret)) }
	run := node.env["NODE_RUN"]
	restore("a", "login1")
	restoredWithSecret(t, cs, ns, "a", secret)
	t.Logf("a: %s", shimLogLine(t, "pulled for a restore", ns+"/a"))
	pulled := filepath.Join(node.env["CHECKPOINTS"], layout.PulledDir(ref[len(ref)-64:]))
	if _, err := layout.ReadManifest(pulled); err != nil {
		t.Fatalf("pulled checkpoint: %v", err)
	}

	restore("b", "wrong")
	msg := sandboxEvent(t, cs, ns, "b", "pod "+ns+"/b may not read")
	if !strings.Contains(msg, "code = PermissionDenied") || !strings.Contains(msg, ref[len(ref)-64:]) ||
		!strings.Contains(msg, "the registry answered 401 Unauthorized to the pod's imagePullSecrets") {
		t.Errorf("pod b, wrong password: %s\nwant PermissionDenied with the registry's 401 to the pod's imagePullSecrets", msg)
	}
	t.Logf("b: %s", msg)
	stillPending(t, cs, ns, "b", secret)

	restore("c", "login1")
	restoredWithSecret(t, cs, ns, "c", secret)
	if l := lastShimLogLine(t, run, "the registry lets a pod read a pulled checkpoint", ns+"/c"); l != "" {
		t.Errorf("pod c, a's credential: the registry was asked again: %s", l)
	}

	restore("d", "login2")
	restoredWithSecret(t, cs, ns, "d", secret)
	t.Logf("d: %s", shimLogLine(t, "the registry lets a pod read a pulled checkpoint", ns+"/d"))

	for _, p := range []string{"b", "c", "d"} {
		if l := lastShimLogLine(t, run, "pulled for a restore", ns+"/"+p); l != "" {
			t.Errorf("pod %s pulled the checkpoint again: %s", p, l)
		}
	}
	// b's retries, meanwhile, were refused every time.
	stillPending(t, cs, ns, "b", secret)
	assertNoImageChange(t, images, "the restores of a, c and d from "+ref+" and the refused ones of b")
}
