package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// installBinaries builds cri-shim and its runtime shim into a temporary
// directory for deploy/install.sh and returns cri-shim's path (the runtime
// shim is next to it, where install.sh looks).
func installBinaries(t *testing.T) string {
	t.Helper()
	repo, _ := filepath.Abs("../..")
	dir := t.TempDir()
	for pkg, out := range map[string]string{"./cmd/cri-shim": "cri-shim", "./cmd/containerd-shim-cri-shim-v2": "containerd-shim-cri-shim-v2"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg)
		build.Dir = repo
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	return filepath.Join(dir, "cri-shim")
}

// runInstall runs deploy/install.sh with args and returns its output and error.
func runInstall(t *testing.T, args ...string) (string, error) {
	t.Helper()
	repo, _ := filepath.Abs("../..")
	out, err := exec.Command(filepath.Join(repo, "deploy/install.sh"), args...).CombinedOutput()
	return string(out), err
}

// stackContainerd is the stack's build of containerd VERSION
// ($CRI_SHIM_STACK/versions/containerd-VERSION, test/stack/install.sh's
// build_containerds); the test skips without it. make e2e builds every
// containerd of the matrix; make run only the newest.
func stackContainerd(t *testing.T, version string) string {
	t.Helper()
	repo, _ := filepath.Abs("../..")
	p := filepath.Join(envOr("CRI_SHIM_STACK", filepath.Join(repo, ".stack")), "versions", "containerd-"+version, "containerd")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("SKIPPED: no containerd %s in the stack (make e2e builds it, or test/stack/install.sh --containerd %s containerds): %v", version, version, err)
	}
	return p
}

// writeFiles writes each path (relative to root) with its body.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// treeOf maps every file under root (relative path) to its content, and
// every directory to "<dir>".
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if fi.IsDir() {
			m[rel] = "<dir>"
			return nil
		}
		b, err := os.ReadFile(p)
		m[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// kubeadmV2Node is a kubeadm node (kubeadmNode) as the kubelet package leaves
// it, an empty KUBELET_EXTRA_ARGS= in /etc/default/kubelet, with an
// operator's /etc/crictl.yaml naming containerd and containerd's version 2
// main config (containerdShapes["v2"]).
func kubeadmV2Node() map[string]string {
	node := kubeadmNode("/etc/default/kubelet")
	node["etc/default/kubelet"] = "KUBELET_EXTRA_ARGS=\n"
	node["etc/crictl.yaml"] = "runtime-endpoint: unix:///run/containerd/containerd.sock\n"
	for k, v := range containerdShapes["v2"] {
		node[k] = v
	}
	return node
}
