package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCgroupFinding(t *testing.T) {
	if f := cgroupFinding(unix.CGROUP2_SUPER_MAGIC); f.level != ok {
		t.Errorf("v2: %+v", f)
	}
	if f := cgroupFinding(unix.TMPFS_MAGIC); f.level != warn || !strings.Contains(f.detail, "failCgroupV1") {
		t.Errorf("v1: %+v", f)
	}
}

func TestCRIUVersionFinding(t *testing.T) {
	for _, c := range []struct {
		out  string
		want level
	}{
		{"Version: 4.1.1\n", ok},
		{"Version: 3.17.1\n", warn},
		{"criu: error while loading shared libraries\n", warn},
	} {
		if f := criuVersionFinding("/usr/sbin/criu", c.out); f.level != c.want {
			t.Errorf("%q: %v (%s), want %v", c.out, f.level, f.detail, c.want)
		}
	}
}

func TestRuntimeVersionFinding(t *testing.T) {
	for _, c := range []struct {
		name, version string
		want          level
	}{
		{"containerd", "v2.2.1", ok},
		{"containerd", "2.0.0", ok},
		{"containerd", "v1.7.24", fail},
		{"cri-o", "1.31.0", warn},
	} {
		if f := runtimeVersionFinding(c.name, c.version); f.level != c.want {
			t.Errorf("%s %s: %v, want %v", c.name, c.version, f.level, c.want)
		}
	}
}

func TestCheckDir(t *testing.T) {
	d := t.TempDir()
	os.Chmod(d, 0o700)
	if f := checkDir("state_dir", d); f.level != ok && os.Geteuid() == 0 {
		t.Errorf("0700: %+v", f)
	}
	os.Chmod(d, 0o755)
	if f := checkDir("state_dir", d); f.level == ok {
		t.Errorf("0755 passed: %+v", f)
	}
	if f := checkDir("state_dir", filepath.Join(d, "missing")); f.level != ok {
		t.Errorf("missing (created at start): %+v", f)
	}
	file := filepath.Join(d, "file")
	os.WriteFile(file, nil, 0o600)
	if f := checkDir("state_dir", file); f.level != fail {
		t.Errorf("a file: %+v", f)
	}
}

// With no kubelet running, its files: flags win over files, drop-ins over the main file.
func TestCheckKubeletFiles(t *testing.T) {
	const shim = "/run/cri-shim/cri-shim.sock"
	write := func(root, rel, body string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body), 0o644)
	}
	for _, c := range []struct {
		name  string
		files map[string]string
		want  level
		has   string
	}{
		{"nothing", nil, warn, "names a runtime endpoint"},
		{"main file on containerd", map[string]string{"var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n"}, warn, "not the shim's"},
		{"drop-in on the shim", map[string]string{
			"var/lib/kubelet/config.yaml":                    "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n",
			"etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": "containerRuntimeEndpoint: unix://" + shim + "\n"}, ok, "shim's socket"},
		{"flag beats the drop-in", map[string]string{
			"var/lib/kubelet/kubeadm-flags.env":              `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"`,
			"etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": "containerRuntimeEndpoint: unix://" + shim + "\n"}, warn, "flags win"},
	} {
		root := t.TempDir()
		for rel, body := range c.files {
			write(root, rel, body)
		}
		f := checkKubeletFiles(root, shim)
		if f.level != c.want || !strings.Contains(f.detail, c.has) {
			t.Errorf("%s: %v %q, want %v containing %q", c.name, f.level, f.detail, c.want, c.has)
		}
	}
}

func TestReportExitCode(t *testing.T) {
	var b bytes.Buffer
	if report(&b, []finding{{"a", ok, "fine", ""}, {"b", warn, "limited", "do x"}}) != 0 {
		t.Error("warnings alone must exit 0")
	}
	if !strings.Contains(b.String(), "fix: do x") {
		t.Errorf("fix not printed:\n%s", b.String())
	}
	if report(&b, []finding{{"a", fail, "broken", "do y"}}) != 1 {
		t.Error("a failure must exit 1")
	}
}

func TestRuntimeStatusFinding(t *testing.T) {
	cond := func(typ string, st bool) *runtimeapi.RuntimeCondition {
		return &runtimeapi.RuntimeCondition{Type: typ, Status: st, Reason: "r", Message: "m"}
	}
	if f := runtimeStatusFinding([]*runtimeapi.RuntimeCondition{cond("RuntimeReady", true), cond("NetworkReady", true),
		cond("ContainerdHasNoDeprecationWarnings", false)}); f.level != ok || !strings.Contains(f.detail, "Deprecation") {
		t.Errorf("a deprecation notice: %+v", f)
	}
	if f := runtimeStatusFinding([]*runtimeapi.RuntimeCondition{cond("RuntimeReady", true), cond("NetworkReady", false)}); f.level != warn {
		t.Errorf("network not ready: %+v", f)
	}
	if f := runtimeStatusFinding(nil); f.level != warn {
		t.Errorf("no conditions: %+v", f)
	}
}

// The kubelet files doctor reads are the node's, not ours: any content gives a
// finding, never a crash.
func FuzzCheckKubeletFiles(f *testing.F) {
	f.Add("containerRuntimeEndpoint: unix:///run/cri-shim/cri-shim.sock\n", `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///x"`)
	f.Add("containerRuntimeEndpoint:\n", "--image-service-endpoint")
	f.Add("containerRuntimeEndpoint: '\"", "--container-runtime-endpoint= ")
	f.Fuzz(func(t *testing.T, conf, flags string) {
		root := t.TempDir()
		for rel, body := range map[string]string{
			"var/lib/kubelet/config.yaml":                    conf,
			"etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": conf,
			"var/lib/kubelet/kubeadm-flags.env":              flags,
		} {
			p := filepath.Join(root, rel)
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte(body), 0o644)
		}
		if f := checkKubeletFiles(root, "/run/cri-shim/cri-shim.sock"); f.name != "kubelet" || f.detail == "" {
			t.Fatalf("no finding: %+v", f)
		}
	})
}

func TestRestoreRouteFinding(t *testing.T) {
	ours := `{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2","runtimePath":"/usr/local/bin/containerd-shim-cri-shim-v2"},"kata":{"runtimeType":"io.containerd.kata.v2"}}}}`
	plain := `{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2"}}}}`
	all := func(string) bool { return true }
	none := func(string) bool { return false }
	for _, tc := range []struct {
		name, cfg string
		exists    func(string) bool
		want      level
		detail    string
	}{
		{"ours", ours, all, ok, "not on handler(s) kata"},
		{"containerd's shim", plain, all, warn, "RestorePod, warm starts and warm restarts fail"},
		{"missing binary", ours, none, fail, "no pod of it can start"},
		{"no config", "", all, warn, "cannot read"},
	} {
		f := restoreRouteFinding(tc.cfg, tc.exists)
		if f.level != tc.want || !strings.Contains(f.detail, tc.detail) {
			t.Errorf("%s: %v %q", tc.name, f.level, f.detail)
		}
	}
}
