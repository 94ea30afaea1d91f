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
		// The kubelet check reads the kubelets running on the machine, which
		// are other lanes' too: an empty --proc leaves it to the files (the
		// check itself: TestInstallKubeletKubeadmUnit and the unit tests).
		cmd := exec.Command(node.env["SHIM_BIN"], "doctor", "--config", cfg, "--proc", t.TempDir())
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
