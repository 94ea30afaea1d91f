package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deploy/install.sh into a scratch root: every file lands, the config is
// checked, an operator's existing config is kept. Needs no root.
func TestDeployInstallScript(t *testing.T) {
	repo, _ := filepath.Abs("../..")
	root := t.TempDir()
	binPath := filepath.Join(t.TempDir(), "cri-shim")
	for cmd, out := range map[string]string{"./cmd/cri-shim": binPath, "./cmd/containerd-shim-cri-shim-v2": filepath.Join(filepath.Dir(binPath), "containerd-shim-cri-shim-v2")} {
		build := exec.Command("go", "build", "-o", out, cmd)
		build.Dir = repo
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
	}
	// A containerd config without an imports line: the drop-in would not be read.
	if err := os.MkdirAll(filepath.Join(root, "etc/containerd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), []byte("version = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/default"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/default/kubelet"), []byte("KUBELET_EXTRA_ARGS=--v=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An old kubeadm's flags file with the endpoint flag, which wins over config files.
	if err := os.MkdirAll(filepath.Join(root, "var/lib/kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/kubelet/kubeadm-flags.env"),
		[]byte("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	install := func() string {
		cmd := exec.Command(filepath.Join(repo, "deploy/install.sh"), "--binary", binPath, "--root", root, "--with-containerd", "--with-kubelet", "--with-crictl")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	out := install()
	for _, f := range []string{
		"usr/local/bin/cri-shim", "etc/cri-shim/config.toml", "etc/systemd/system/cri-shim.service", "etc/systemd/system/cri-shim.socket",
		"etc/systemd/system/kubelet.service.d/20-cri-shim.conf", "etc/kubernetes/kubelet.conf.d/50-cri-shim.conf", "etc/crictl.yaml",
		"usr/local/share/doc/cri-shim/operations.md", "usr/local/bin/containerd-shim-cri-shim-v2", "etc/containerd/conf.d/50-cri-shim.toml",
	} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	if !strings.Contains(out, "does not import /etc/containerd/conf.d/*.toml") {
		t.Errorf("no warning that containerd's config does not import the drop-in:\n%s", out)
	}
	if !strings.Contains(out, "WARNING: /etc/default/kubelet sets KUBELET_EXTRA_ARGS") {
		t.Errorf("no warning about /etc/default/kubelet overriding the drop-in:\n%s", out)
	}
	if !strings.Contains(out, "WARNING: /var/lib/kubelet/kubeadm-flags.env passes --container-runtime-endpoint") {
		t.Errorf("no warning about an endpoint flag in kubeadm-flags.env:\n%s", out)
	}
	cfg := filepath.Join(root, "etc/cri-shim/config.toml")
	if err := os.WriteFile(cfg, []byte("[log]\nlevel = \"debug\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	install()
	if b, _ := os.ReadFile(cfg); !strings.Contains(string(b), "debug") {
		t.Fatal("reinstall overwrote the operator's config")
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/bin/cri-shim.previous")); err != nil {
		t.Errorf("an upgrade keeps no previous binary to roll back to: %v", err)
	}
}

// The systemd unit passes systemd-analyze verify without a single complaint
// (verify exits 0 on a value it ignores, so its output must be empty too), and
// keeps the settings a node's runtime path needs.
func TestSystemdUnitVerifies(t *testing.T) {
	repo, _ := filepath.Abs("../..")
	b, err := os.ReadFile(filepath.Join(repo, "deploy/cri-shim.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "WatchdogSec=", "StartLimitIntervalSec=0", "Restart=always",
		"RuntimeDirectory=cri-shim", "StateDirectory=cri-shim", "OOMScoreAdjust=-999", "LimitNOFILE=", "TasksMax=infinity",
		"After=network.target local-fs.target containerd.service", "Before=kubelet.service"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	sock, err := os.ReadFile(filepath.Join(repo, "deploy/cri-shim.socket"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ListenStream=/run/cri-shim/cri-shim.sock", "SocketMode=0660", "Service=cri-shim.service"} {
		if !strings.Contains(string(sock), want) {
			t.Errorf("socket unit lacks %q", want)
		}
	}
	for _, want := range []string{"Requires=cri-shim.socket", "ExecReload=/bin/kill -USR2 $MAINPID"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	// verify checks that ExecStart's binary exists: point it at one that does.
	dir := t.TempDir()
	unit := filepath.Join(dir, "cri-shim.service")
	if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/cri-shim", "/bin/true")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cri-shim.socket"), sock, 0o644); err != nil {
		t.Fatal(err)
	}
	// The router's unit: unprivileged, its kubeconfig a credential.
	rb, err := os.ReadFile(filepath.Join(repo, "deploy/cri-shim-router.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DynamicUser=yes", "LoadCredential=kubeconfig:", "cri-shim router --kubeconfig ${CREDENTIALS_DIRECTORY}/kubeconfig", "Restart=always"} {
		if !strings.Contains(string(rb), want) {
			t.Errorf("router unit lacks %q", want)
		}
	}
	router := filepath.Join(dir, "cri-shim-router.service")
	if err := os.WriteFile(router, []byte(strings.ReplaceAll(string(rb), "/usr/local/bin/cri-shim", "/bin/true")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{unit, filepath.Join(dir, "cri-shim.socket"), router} {
		out, err := exec.Command("systemd-analyze", "verify", u).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Fatalf("systemd-analyze verify %s: %v\n%s", filepath.Base(u), err, out)
		}
	}
}

// The kubelet configuration drop-in as deploy/install.sh installs it: a real
// kubelet v1.36 whose own configuration points at containerd runs its pods
// through the shim once deploy/kubelet/50-cri-shim.conf is in its
// --config-dir (the socket path swapped for the test node's).
func TestKubeletConfigDropIn(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	t.Cleanup(func() { pauseKubelet(t) })
	if err := script("up.sh", "--start", "kubelet-dropin"); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		KubeletConfig struct {
			ContainerRuntimeEndpoint string `json:"containerRuntimeEndpoint"`
			ImageServiceEndpoint     string `json:"imageServiceEndpoint"`
		} `json:"kubeletconfig"`
	}
	body, err := kubeletDo(t, http.MethodGet, "/configz")
	if err != nil {
		t.Fatal(err)
	}
	mustUnmarshal(t, body, &cfg)
	want := "unix://" + node.env["SHIM_SOCK"]
	if cfg.KubeletConfig.ContainerRuntimeEndpoint != want || cfg.KubeletConfig.ImageServiceEndpoint != want {
		t.Fatalf("kubelet endpoints %q / %q, want %q (the drop-in did not apply)",
			cfg.KubeletConfig.ContainerRuntimeEndpoint, cfg.KubeletConfig.ImageServiceEndpoint, want)
	}
	runs := func() float64 {
		return metricValue(scrapeMetrics(t), `cri_shim_grpc_requests_total{method="runtime.v1.RuntimeService/RunPodSandbox"}`)
	}
	before := runs()
	if before < 0 {
		t.Fatal("no RunPodSandbox series in the shim's metrics")
	}
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: dropin, namespace: default}
spec:
  containers:
  - {name: main, image: ` + busybox + `, imagePullPolicy: Never, command: [sleep, "3600"]}
`
	if err := os.WriteFile(filepath.Join(node.env["MANIFESTS"], "dropin.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the pod's sandbox created through the shim", func() error {
		if n := runs(); n <= before {
			return fmt.Errorf("RunPodSandbox through the shim: %v, was %v", n, before)
		}
		return nil
	})
}

// cri-shim doctor on the running test node: containerd 2, the shim's socket
// and CRIU (the stack's, first on PATH) pass, and the pods' handler runs the
// runtime shim (restore route); nothing fails, so it exits 0.
// Pointed at a runtime socket that does not exist it fails, naming the fix.
func TestDoctor(t *testing.T) {
	needNode(t)
	doctor := func(cfg string) (string, error) {
		cmd := exec.Command(node.env["SHIM_BIN"], "doctor", "--config", cfg)
		cmd.Env = append(os.Environ(), "PATH="+node.env["BIN"]+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := doctor(node.env["SHIM_CONFIG"])
	t.Logf("cri-shim doctor:\n%s", out)
	if err != nil {
		t.Fatalf("doctor failed on a working node: %v", err)
	}
	for _, want := range []string{"[ OK ] config", "[ OK ] containerd       containerd 2.", "[ OK ] shim socket", "[ OK ] criu", "a trial dump: done", "[ OK ] runtime status", "[ OK ] restore route"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q", want)
		}
	}
	b, err := os.ReadFile(node.env["SHIM_CONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(bad, []byte(strings.Replace(string(b), node.env["CONTAINERD_SOCK"], "/run/nothing-here.sock", 1)), 0o600)
	out, err = doctor(bad)
	if err == nil || !strings.Contains(out, "[FAIL] containerd") || !strings.Contains(out, "fix: check runtime.endpoint") {
		t.Fatalf("doctor with a missing runtime socket: %v\n%s", err, out)
	}
}
