package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// deploy/install.sh into a scratch root: every file lands, the config is
// checked, an operator's existing config is kept. Needs no root.
func TestDeployInstallScript(t *testing.T) {
	repo, _ := filepath.Abs("../..")
	root := t.TempDir()
	binPath := filepath.Join(t.TempDir(), "cri-shim")
	build := exec.Command("go", "build", "-o", binPath, "./cmd/cri-shim")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/default"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/default/kubelet"), []byte("KUBELET_EXTRA_ARGS=--v=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	install := func() string {
		cmd := exec.Command(filepath.Join(repo, "deploy/install.sh"), "--binary", binPath, "--root", root, "--with-kubelet", "--with-crictl")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	out := install()
	for _, f := range []string{
		"usr/local/bin/cri-shim", "etc/cri-shim/config.toml", "etc/systemd/system/cri-shim.service",
		"etc/systemd/system/kubelet.service.d/20-cri-shim.conf", "etc/crictl.yaml",
		"usr/local/share/doc/cri-shim/operations.md",
	} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	if !strings.Contains(out, "WARNING: /etc/default/kubelet sets KUBELET_EXTRA_ARGS") {
		t.Errorf("no warning about /etc/default/kubelet overriding the drop-in:\n%s", out)
	}
	cfg := filepath.Join(root, "etc/cri-shim/config.toml")
	if err := os.WriteFile(cfg, []byte("[log]\nlevel = \"debug\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	install()
	if b, _ := os.ReadFile(cfg); !strings.Contains(string(b), "debug") {
		t.Fatal("reinstall overwrote the operator's config")
	}
}
