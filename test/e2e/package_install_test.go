package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The .deb's node steps: the package (stand-in binaries) unpacked into a
// root that mimics a kubeadm node with a version 2 containerd config, the
// kubelet package's empty KUBELET_EXTRA_ARGS= and an operator's
// /etc/crictl.yaml; then the packaged /usr/share/cri-shim/install.sh
// --with-containerd --with-kubelet --with-crictl, as docs/operations.md ("The
// .deb") says. The kubelet's command line as systemd composes it reads the
// shim's endpoint through --config-dir; the containerd drop-in is the
// version 2 one naming the package's /usr/bin runtime shim, and containerd's
// effective config changes in that runtime_path only (on containerd 2.2,
// where a version 3 drop-in would lose the main config's CRI settings);
// crictl names the shim; nothing of the package's (/usr, /lib,
// /etc/cri-shim) is placed or changed; a dry run and an unchanged re-run
// change nothing; --binary and --rollback are refused (apt's); the package's
// prerm refuses removal while the steps are in place; --uninstall leaves the
// root file for file as the unpacked package left it, and then prerm lets
// the package go.
func TestDebPackagedInstall(t *testing.T) {
	ctrd := stackContainerd(t, "2.2.9")
	deb := standInDeb(t)
	root, ctrl := t.TempDir(), t.TempDir()
	runIn(t, root, "dpkg-deb", "-x", deb, root)
	runIn(t, ctrl, "dpkg-deb", "-e", deb, ctrl)
	writeFiles(t, root, kubeadmV2Node())
	unpacked := treeOf(t, root)
	dumpBefore := containerdDump(t, ctrd, root)
	script := filepath.Join(root, "usr/share/cri-shim/install.sh")
	run := func(args ...string) (string, error) {
		out, err := exec.Command(script, append([]string{"--root", root, "--containerd-bin", ctrd}, args...)...).CombinedOutput()
		return string(out), err
	}
	steps := []string{"--with-containerd", "--with-kubelet", "--with-crictl"}
	prerm := func(arg string) error {
		cmd := exec.Command("sh", filepath.Join(ctrl, "prerm"), arg)
		cmd.Env = append(os.Environ(), "DPKG_ROOT="+root)
		return cmd.Run()
	}

	out, err := run(append(steps, "--dry-run")...)
	if err != nil || !strings.Contains(out, "would install /etc/systemd/system/kubelet.service.d/20-cri-shim.conf") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if d := treeDiff(unpacked, treeOf(t, root)); len(d) > 0 {
		t.Fatalf("a dry run changed files: %v", d)
	}

	if out, err = run(steps...); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	args := composeKubelet(t, root)
	if ep := kubeletEndpoint(t, root, args); ep != shimEndpoint {
		t.Errorf("the kubelet's endpoint is %q, not the shim's; command line %q\n%s", ep, args, out)
	}
	if !slices.Contains(args, "--config-dir=/etc/kubernetes/kubelet.conf.d") || !slices.Contains(args, "--node-ip=10.0.0.5") {
		t.Errorf("the composed command line lacks --config-dir or the operator's --node-ip: %q", args)
	}
	dropin, _ := os.ReadFile(filepath.Join(root, "etc/containerd/conf.d/50-cri-shim.toml"))
	shipped, _ := os.ReadFile(filepath.Join(root, "usr/share/cri-shim/containerd/v2/50-cri-shim.toml"))
	if len(dropin) == 0 || string(dropin) != string(shipped) {
		t.Errorf("the containerd drop-in is not the package's version 2 one:\n%s", dropin)
	}
	gone, added := changedLines(dumpBefore, containerdDump(t, ctrd, root))
	want := "runtime_path = '/usr/bin/containerd-shim-cri-shim-v2'"
	if len(added) != 1 || strings.TrimSpace(added[0]) != want || len(gone) != 1 || !runtimePathLine.MatchString(gone[0]) {
		t.Errorf("containerd's effective config changed beyond %s: gone %q, added %q", want, gone, added)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/crictl.yaml")); !strings.Contains(string(b), "cri-shim.sock") {
		t.Errorf("/etc/crictl.yaml does not name the shim:\n%s", b)
	}
	installed := treeOf(t, root)
	for _, d := range treeDiff(unpacked, installed) {
		p := d[1:] // after the -, ~ or + of treeDiff
		if strings.HasPrefix(p, "usr") || strings.HasPrefix(p, "lib") || strings.HasPrefix(p, "etc/cri-shim") || strings.Contains(p, "/cri-shim.s") {
			t.Errorf("install.sh placed or changed %s (%s), the package's to own", p, d)
		}
	}
	if out, err = run(steps...); err != nil {
		t.Fatalf("install.sh again: %v\n%s", err, out)
	}
	if d := treeDiff(installed, treeOf(t, root)); len(d) > 0 {
		t.Errorf("an unchanged re-run changed files: %v", d)
	}

	for _, refused := range [][]string{{"--rollback"}, {"--binary", filepath.Join(root, "usr/bin/cri-shim")}} {
		if out, err := run(refused...); err == nil || !strings.Contains(out, "apt") {
			t.Errorf("install.sh %s on a packaged node: %v\n%s", refused[0], err, out)
		}
	}
	if err := prerm("remove"); err == nil {
		t.Error("prerm remove passed with the node steps in place")
	}
	if err := prerm("upgrade"); err != nil {
		t.Errorf("prerm upgrade: %v", err)
	}

	if out, err = run("--uninstall"); err != nil {
		t.Fatalf("install.sh --uninstall: %v\n%s", err, out)
	}
	if d := treeDiff(unpacked, treeOf(t, root)); len(d) > 0 {
		t.Errorf("uninstall left the root changed from the unpacked package: %v\n%s", d, out)
	}
	if err := prerm("remove"); err != nil {
		t.Errorf("prerm remove after uninstall: %v", err)
	}
}
