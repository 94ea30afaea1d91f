package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A node's life with deploy/install.sh, in a root that mimics a kubeadm node
// with containerd's version 2 config and an operator's /etc/crictl.yaml:
// install (binary, units, runtime shim, containerd drop-in) -> install again
// with more flags (adds the kubelet drop-ins and crictl config, replacing the
// operator's crictl.yaml) -> upgrade (a new binary; the old one kept) ->
// rollback (the previous binary back) -> uninstall. Each step's files are as
// docs/operations.md lists them; after uninstall the root is file for file
// what it was before the first install, the replaced crictl.yaml included.
// An operator's edited config survives every install.
func TestInstallLifecycle(t *testing.T) {
	bin := installBinaries(t)
	ctrd := stackContainerd(t, "2.4.2")
	root := t.TempDir()
	writeFiles(t, root, kubeadmV2Node())
	pristine := treeOf(t, root)
	install := func(args ...string) string {
		t.Helper()
		out, err := runInstall(t, append([]string{"--root", root, "--containerd-bin", ctrd}, args...)...)
		if err != nil {
			t.Fatalf("install.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	has := func(step string, want ...string) {
		t.Helper()
		for _, f := range want {
			if !fileExists(filepath.Join(root, f)) {
				t.Errorf("%s: missing /%s", step, f)
			}
		}
	}
	hasNot := func(step string, unwanted ...string) {
		t.Helper()
		for _, f := range unwanted {
			if fileExists(filepath.Join(root, f)) {
				t.Errorf("%s: /%s should not be there", step, f)
			}
		}
	}
	base := []string{"usr/local/bin/cri-shim", "usr/local/bin/containerd-shim-cri-shim-v2", "etc/cri-shim/config.toml",
		"etc/systemd/system/cri-shim.socket", "etc/systemd/system/cri-shim.service", "usr/local/share/doc/cri-shim/operations.md",
		"etc/containerd/conf.d/50-cri-shim.toml", "var/lib/cri-shim-install/files"}
	kubelet := []string{"etc/systemd/system/kubelet.service.d/20-cri-shim.conf", "etc/kubernetes/kubelet.conf.d/50-cri-shim.conf"}

	// 1. install
	install("--binary", bin, "--with-containerd")
	has("install", base...)
	hasNot("install", append(kubelet, "usr/local/bin/cri-shim.previous")...)
	cfg := filepath.Join(root, "etc/cri-shim/config.toml")
	if err := os.WriteFile(cfg, []byte("[log]\nlevel = \"debug\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	firstBin, _ := os.ReadFile(filepath.Join(root, "usr/local/bin/cri-shim"))

	// 2. again, with more flags
	install("--binary", bin, "--with-containerd", "--with-kubelet", "--with-crictl")
	has("install again", append(base, kubelet...)...)
	if b, _ := os.ReadFile(filepath.Join(root, "etc/crictl.yaml")); !strings.Contains(string(b), "cri-shim.sock") {
		t.Errorf("install again: /etc/crictl.yaml does not name the shim:\n%s", b)
	}
	if b, _ := os.ReadFile(cfg); !strings.Contains(string(b), "debug") {
		t.Error("install again overwrote the operator's config")
	}
	if ep := kubeletEndpoint(t, root, composeKubelet(t, root)); ep != shimEndpoint {
		t.Errorf("install again: the kubelet's endpoint is %s", ep)
	}
	steady := treeOf(t, root)
	install("--binary", bin, "--with-containerd", "--with-kubelet", "--with-crictl")
	if d := treeDiff(steady, treeOf(t, root)); len(d) > 0 {
		t.Errorf("an unchanged re-run changed files: %v", d)
	}

	// 3. upgrade: another binary (its content differs); the old one is kept.
	newer := filepath.Join(t.TempDir(), "cri-shim")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/cri-shim/cri-shim/internal/version.Version=9.9.9-test", "-o", newer, "./cmd/cri-shim")
	build.Dir, _ = filepath.Abs("../..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if err := os.Link(filepath.Join(filepath.Dir(bin), "containerd-shim-cri-shim-v2"), filepath.Join(filepath.Dir(newer), "containerd-shim-cri-shim-v2")); err != nil {
		t.Fatal(err)
	}
	install("--binary", newer, "--with-containerd", "--with-kubelet", "--with-crictl")
	has("upgrade", "usr/local/bin/cri-shim.previous")
	if prev, _ := os.ReadFile(filepath.Join(root, "usr/local/bin/cri-shim.previous")); !slices.Equal(prev, firstBin) {
		t.Error("upgrade: cri-shim.previous is not the binary it replaced")
	}
	version := func() string {
		out, _ := exec.Command(filepath.Join(root, "usr/local/bin/cri-shim"), "version").Output()
		return string(out)
	}
	if v := version(); !strings.Contains(v, "9.9.9-test") {
		t.Errorf("upgrade: installed binary reports %q", v)
	}

	// 4. rollback: the previous binary back.
	install("--rollback")
	if v := version(); strings.Contains(v, "9.9.9-test") {
		t.Errorf("rollback: the binary is still the upgrade: %q", v)
	}
	has("rollback", "usr/local/bin/cri-shim.rolledback")

	// 5. uninstall: the root as it was, the operator's crictl.yaml back.
	install("--uninstall")
	if d := treeDiff(pristine, treeOf(t, root)); len(d) > 0 {
		t.Errorf("uninstall left the root changed: %v", d)
	}
	if out := install("--uninstall"); !strings.Contains(out, "nothing to uninstall") {
		t.Errorf("a second uninstall: %s", out)
	}
}
