package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make release's script for one architecture: the tarball, the .deb and
// SHA256SUMS agree; the package, installed into a root, holds every unit and
// drop-in a node needs and its units pass systemd-analyze verify there
// (verifyDeb); the binary reports the version it was built as; the tarball's
// deploy/install.sh installs it. Needs no root.
func TestReleaseArtifacts(t *testing.T) {
	longOnly(t, "release packaging builds every artifact")
	repo, _ := filepath.Abs("../..")
	out := t.TempDir()
	runIn(t, repo, "build/release.sh", "v1.2.3-test", out, "amd64")
	runIn(t, out, "sha256sum", "-c", "SHA256SUMS")
	deb := filepath.Join(out, "cri-shim_1.2.3-test_amd64.deb")
	info := runIn(t, out, "dpkg-deb", "-f", deb, "Package", "Version", "Architecture")
	for _, want := range []string{"Package: cri-shim", "Version: 1.2.3-test", "Architecture: amd64"} {
		if !strings.Contains(info, want) {
			t.Errorf("deb control lacks %q:\n%s", want, info)
		}
	}
	verifyDeb(t, deb)
	runIn(t, out, "tar", "xzf", "cri-shim-1.2.3-test-linux-amd64.tar.gz")
	dir := filepath.Join(out, "cri-shim-1.2.3-test-linux-amd64")
	if v := runIn(t, dir, "_output/cri-shim", "version"); !strings.HasPrefix(v, "cri-shim 1.2.3-test (revision ") || strings.Contains(v, "unknown") {
		t.Errorf("version of the released binary: %q", v)
	}
	for _, f := range []string{"LICENSE", "CHANGELOG.md", "README.md", "deploy/cri-shim.service", "docs/operations.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("tarball lacks %s", f)
		}
	}
	root := t.TempDir()
	runIn(t, dir, "deploy/install.sh", "--root", root)
	if _, err := os.Stat(filepath.Join(root, "usr/local/bin/cri-shim")); err != nil {
		t.Errorf("install.sh from the tarball: %v", err)
	}
}
