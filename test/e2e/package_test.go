package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The .deb as build/deb.sh makes it, from stand-in binaries (the package's
// layout and units do not depend on what the binaries do; the real ones are
// TestReleaseArtifacts'): installed into a root, its units pass
// systemd-analyze verify there. Cheap enough for the fast tier.
func TestDebPackageUnits(t *testing.T) {
	verifyDeb(t, standInDeb(t))
}

// standInDeb builds the .deb with build/deb.sh from stand-in binaries (they
// exit 0) and returns its path.
func standInDeb(t *testing.T) string {
	t.Helper()
	repo, _ := filepath.Abs("../..")
	bin, out := t.TempDir(), t.TempDir()
	for _, b := range []string{"cri-shim", "containerd-shim-cri-shim-v2"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	runIn(t, repo, "build/deb.sh", "0.0.0-test", "amd64", bin, out)
	return filepath.Join(out, "cri-shim_0.0.0-test_amd64.deb")
}

// runIn runs a command in dir and returns its output; it fails the test on
// an error.
func runIn(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return string(b)
}

// packageUnits are the units the package installs, none enabled.
var packageUnits = []string{"cri-shim.socket", "cri-shim.service", "cri-shim-router.service"}

// verifyDeb installs the package into a scratch root (dpkg-deb -x: its files,
// not its scripts) and checks what a node needs of it: every unit and
// drop-in; nothing that reconfigures the node on install (no file in /etc but
// its own config, no unit enabled or started by its scripts); the units pass
// `systemd-analyze verify --root` (systemd 252 loads units, their
// dependencies and their Exec paths from the root) without a word; the docs
// they name and the runtime shim both containerd drop-ins name are installed;
// the drop-ins name the socket the socket unit listens on; and the kubelet's
// systemd drop-in, as the packaged /usr/share/cri-shim/install.sh
// --with-kubelet writes it, verifies with the kubelet unit the Kubernetes
// packages ship.
func verifyDeb(t *testing.T, deb string) {
	t.Helper()
	root, ctrl := t.TempDir(), t.TempDir()
	runIn(t, root, "dpkg-deb", "-x", deb, root)
	runIn(t, ctrl, "dpkg-deb", "-e", deb, ctrl)
	units := filepath.Join(root, "lib/systemd/system")
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, f := range []string{"usr/bin/cri-shim", "usr/bin/containerd-shim-cri-shim-v2", "etc/cri-shim/config.toml",
		"usr/share/cri-shim/kubelet/20-cri-shim.conf", "usr/share/cri-shim/kubelet/50-cri-shim.conf",
		"usr/share/cri-shim/containerd/50-cri-shim.toml", "usr/share/cri-shim/containerd/v2/50-cri-shim.toml",
		"usr/share/cri-shim/crictl.yaml", "usr/share/cri-shim/install.sh", "usr/share/cri-shim/lib/files.sh",
		"usr/share/cri-shim/lib/containerd.sh", "usr/share/cri-shim/lib/kubelet.sh",
		"usr/share/doc/cri-shim/copyright", "usr/share/doc/cri-shim/operations.md"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("the package lacks /%s", f)
		}
	}
	for _, u := range packageUnits {
		if _, err := os.Stat(filepath.Join(units, u)); err != nil {
			t.Errorf("the package lacks the unit %s", u)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ctrl, "conffiles")); err != nil || !strings.Contains(string(b), "/etc/cri-shim/config.toml") {
		t.Errorf("config.toml is not a conffile: %q, %v", b, err)
	}
	// Installing must not switch the node: no file in another package's
	// configuration (kubelet, containerd, crictl) and no unit drop-in.
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		switch {
		case err != nil:
			t.Error(err)
		case !d.IsDir() && strings.HasPrefix(rel, "etc/") && !strings.HasPrefix(rel, "etc/cri-shim/"):
			t.Errorf("the package installs /%s, another package's configuration", rel)
		case d.IsDir() && strings.HasSuffix(rel, ".d") && strings.Contains(rel, "systemd/"):
			t.Errorf("the package installs a unit drop-in directory /%s", rel)
		}
		return nil
	})
	verbs := regexp.MustCompile(`systemctl\s+(\S+)`)
	for _, s := range []string{"preinst", "postinst", "prerm", "postrm"} {
		b, err := os.ReadFile(filepath.Join(ctrl, s))
		if err != nil {
			continue
		}
		for _, m := range verbs.FindAllStringSubmatch(string(b), -1) {
			if m[1] != "daemon-reload" {
				t.Errorf("%s runs systemctl %s: the package must not enable or start anything", s, m[1])
			}
		}
		if strings.Contains(string(b), "deb-systemd-") {
			t.Errorf("%s calls deb-systemd-helper or -invoke, which enable and start units", s)
		}
	}

	// The rest of a Debian system the units rely on: systemd's own units
	// (targets the units order against) and ExecReload's /bin/kill (procps).
	hostUnits := "/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(hostUnits, "sysinit.target")); err != nil {
		t.Fatalf("no systemd units on this host to complete the root with: %v", err)
	}
	runIn(t, root, "cp", "-an", hostUnits+"/.", units+"/")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	runIn(t, root, "cp", "/bin/kill", filepath.Join(root, "bin/kill"))
	// The kubelet drop-in as the packaged install.sh writes it, with the
	// kubelet unit of the Kubernetes packages (kubernetes/release,
	// cmd/krel/templates/latest/kubelet/kubelet.service).
	kubelet := "[Unit]\nDescription=kubelet: The Kubernetes Node Agent\nWants=network-online.target\nAfter=network-online.target\n\n" +
		"[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\nStartLimitInterval=0\nRestartSec=10\n\n[Install]\nWantedBy=multi-user.target\n"
	if err := os.WriteFile(filepath.Join(units, "kubelet.service"), []byte(kubelet), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/kubelet"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	runIn(t, root, filepath.Join(root, "usr/share/cri-shim/install.sh"), "--root", root, "--with-kubelet")
	if !strings.Contains(read("etc/systemd/system/kubelet.service.d/20-cri-shim.conf"), "\nExecStart=/usr/bin/kubelet --config-dir=") {
		t.Error("the packaged install.sh wrote no ExecStart= with --config-dir for the kubelet")
	}
	for _, u := range append(packageUnits, "kubelet.service") {
		// verify exits 0 on a setting it ignores: its output must be empty too.
		out, err := exec.Command("systemd-analyze", "verify", "--root="+root, u).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify --root %s: %v\n%s", u, err, out)
		}
	}

	docs := regexp.MustCompile(`(?m)^Documentation=(.*)$`)
	for _, u := range packageUnits {
		b, err := os.ReadFile(filepath.Join(units, u))
		if err != nil {
			continue
		}
		for _, m := range docs.FindAllStringSubmatch(string(b), -1) {
			for _, uri := range strings.Fields(m[1]) {
				if p, ok := strings.CutPrefix(uri, "file://"); ok {
					if _, err := os.Stat(filepath.Join(root, p)); err != nil {
						t.Errorf("%s names %s, which the package does not install", u, uri)
					}
				}
			}
		}
	}
	for _, f := range []string{"usr/share/cri-shim/containerd/50-cri-shim.toml", "usr/share/cri-shim/containerd/v2/50-cri-shim.toml"} {
		shim := regexp.MustCompile(`(?m)^\s*runtime_path\s*=\s*"([^"]+)"`).FindStringSubmatch(read(f))
		if shim == nil {
			t.Errorf("/%s names no runtime_path", f)
		} else if st, err := os.Stat(filepath.Join(root, shim[1])); err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("/%s: runtime_path %s is not an executable the package installs: %v", f, shim[1], err)
		}
	}
	listen := regexp.MustCompile(`(?m)^ListenStream=(/\S+)$`).FindStringSubmatch(read("lib/systemd/system/cri-shim.socket"))
	if listen == nil {
		t.Fatal("cri-shim.socket has no ListenStream path")
	}
	endpoint := "unix://" + listen[1]
	for f, keys := range map[string][]string{
		"usr/share/cri-shim/kubelet/50-cri-shim.conf": {"containerRuntimeEndpoint: ", "imageServiceEndpoint: "},
		"usr/share/cri-shim/crictl.yaml":              {"runtime-endpoint: ", "image-endpoint: "},
	} {
		for _, k := range keys {
			if !strings.Contains(read(f), "\n"+k+endpoint+"\n") {
				t.Errorf("/%s does not set %s%s", f, k, endpoint)
			}
		}
	}
}
