package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make release's script for one architecture: the tarball, the .deb and
// SHA256SUMS agree; the package installs the binary, unit, config (as a
// conffile) and license where a Debian system expects them; the binary reports
// the version it was built as; the tarball's deploy/install.sh installs it.
// Needs no root.
func TestReleaseArtifacts(t *testing.T) {
	longOnly(t, "release packaging builds every artifact")
	repo, _ := filepath.Abs("../..")
	out := t.TempDir()
	run := func(dir, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	run(repo, "build/release.sh", "v1.2.3-test", out, "amd64")
	run(out, "sha256sum", "-c", "SHA256SUMS")
	deb := filepath.Join(out, "cri-shim_1.2.3-test_amd64.deb")
	info := run(out, "dpkg-deb", "-f", deb, "Package", "Version", "Architecture")
	for _, want := range []string{"Package: cri-shim", "Version: 1.2.3-test", "Architecture: amd64"} {
		if !strings.Contains(info, want) {
			t.Errorf("deb control lacks %q:\n%s", want, info)
		}
	}
	files := run(out, "dpkg-deb", "-c", deb)
	for _, want := range []string{"./usr/bin/cri-shim", "./lib/systemd/system/cri-shim.service", "./etc/cri-shim/config.toml",
		"./usr/share/doc/cri-shim/copyright", "./usr/share/cri-shim/kubelet/20-cri-shim.conf"} {
		if !strings.Contains(files, want) {
			t.Errorf("deb lacks %s", want)
		}
	}
	if conf := run(out, "sh", "-c", "dpkg-deb --ctrl-tarfile "+deb+" | tar -xO ./conffiles"); !strings.Contains(conf, "/etc/cri-shim/config.toml") {
		t.Errorf("config.toml is not a conffile: %q", conf)
	}
	run(out, "tar", "xzf", "cri-shim-1.2.3-test-linux-amd64.tar.gz")
	dir := filepath.Join(out, "cri-shim-1.2.3-test-linux-amd64")
	if v := run(dir, "_output/cri-shim", "version"); !strings.HasPrefix(v, "cri-shim 1.2.3-test (revision ") || strings.Contains(v, "unknown") {
		t.Errorf("version of the released binary: %q", v)
	}
	for _, f := range []string{"LICENSE", "CHANGELOG.md", "README.md", "deploy/cri-shim.service", "docs/operations.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("tarball lacks %s", f)
		}
	}
	root := t.TempDir()
	run(dir, "deploy/install.sh", "--root", root)
	if _, err := os.Stat(filepath.Join(root, "usr/local/bin/cri-shim")); err != nil {
		t.Errorf("install.sh from the tarball: %v", err)
	}
}
