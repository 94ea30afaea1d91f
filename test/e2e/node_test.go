// Package e2e runs cri-shim on a real node: containerd v2, runc, CRIU, CNI and a
// standalone kubelet v1.36, installed by test/stack/install.sh and started by
// test/stack/up.sh. It needs root. When the node cannot be used (not root, the
// stack not installed, the node not coming up) the suite FAILS with a banner
// saying why: a skipped end-to-end suite is not a pass. Only with
// CRI_SHIM_E2E_ALLOW_SKIP=1 (to build and list the tests, nothing verified)
// do the tests skip and the run exit 0.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// allowSkipEnv, set to 1, lets the suite skip every test and exit 0 when
// the node cannot be used: for building and listing the tests only.
const allowSkipEnv = "CRI_SHIM_E2E_ALLOW_SKIP"

// banner is what a run that could not use the real stack prints, with why.
func banner(why string, allowed bool) string {
	verdict := "FAILED: a skipped end-to-end suite is not a pass."
	if allowed {
		verdict = "SKIPPED (" + allowSkipEnv + "=1): every test skips."
	}
	line := strings.Repeat("!", 80)
	return fmt.Sprintf("\n%s\n!!! cri-shim end-to-end tests NOT RUN: %s\n!!! Nothing was verified on the real stack.\n!!! %s\n"+
		"!!! Run as root on a machine where `make stack` works (sudo make test), or\n"+
		"!!! `make unit` for the unit tests alone. %s=1 only builds and lists the tests.\n%s\n",
		line, why, verdict, allowSkipEnv, line)
}

// node is the running test node, filled by TestMain from $NODE_RUN/env.
var node struct {
	up   bool
	repo string
	env  map[string]string

	registryOnce sync.Once
	registryErr  error
	// the TLS registry (checkpoint_tls_test.go)
	registryTLSOnce sync.Once
	registryTLSErr  error
	// the registry that wants a login (checkpoint_auth_test.go)
	registryAuthOnce sync.Once
	registryAuthErr  error

	apiOnce sync.Once
	apiErr  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run()) // go test -list: nothing runs
	}
	if why := nodeUnusable(); why != "" {
		allowed := os.Getenv(allowSkipEnv) == "1"
		fmt.Fprint(os.Stderr, banner(why, allowed))
		code := m.Run() // every test skips (needNode)
		if !allowed {
			fmt.Fprint(os.Stderr, banner(why, allowed))
			code = 1
		}
		os.Exit(code)
	}
	code := m.Run()
	if os.Getenv("CRI_SHIM_E2E_KEEP") == "" {
		_ = script("down.sh")
	} else {
		fmt.Fprintf(os.Stderr, "e2e: CRI_SHIM_E2E_KEEP set: node left running; env in %s\n", node.env["NODE_RUN"]+"/env")
	}
	os.Exit(code)
}

// nodeUnusable brings the test node up and says why it cannot be used ("" if it can).
func nodeUnusable() string {
	if os.Geteuid() != 0 {
		return fmt.Sprintf("not root (uid %d): containerd, runc and the kubelet need root.", os.Geteuid())
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		return err.Error()
	}
	node.repo = repo
	if err := bringUp(); err != nil {
		return fmt.Sprintf("the test node did not come up (stack at %s; `make stack` installs it): %v", envOr("CRI_SHIM_STACK", ".stack"), err)
	}
	return ""
}

func bringUp() error {
	if err := binariesUnderTest(); err != nil {
		return err
	}
	if err := script("up.sh"); err != nil {
		return err
	}
	run, err := nodeRunDir()
	if err != nil {
		return err
	}
	env, err := readEnv(filepath.Join(run, "env"))
	if err != nil {
		return err
	}
	node.env = env
	node.up = true
	return nil
}

// binariesUnderTest makes sure the node runs what `make build` makes, with
// its version: _output/cri-shim and the runtime shim, built by make build
// (make e2e's first step) when missing or older than a source file. Lanes
// starting together build once: the build holds a lock on _output.
func binariesUnderTest() error {
	out := filepath.Join(node.repo, "_output")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(out, ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	bins := []string{filepath.Join(out, "cri-shim"), filepath.Join(out, "containerd-shim-cri-shim-v2")}
	if stale, why := staleBinaries(bins); stale {
		fmt.Fprintf(os.Stderr, "e2e: %s: make build\n", why)
		build := exec.Command("make", "build")
		build.Dir = node.repo
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("make build: %w", err)
		}
	}
	v, err := exec.Command(bins[0], "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s version: %v: %s", bins[0], err, v)
	}
	fmt.Fprintf(os.Stderr, "e2e: binary under test: %s", v)
	return nil
}

// staleBinaries: a binary is missing, or a Go source, go.mod or go.sum of
// the module is newer than one.
func staleBinaries(bins []string) (bool, string) {
	oldest := time.Time{}
	for _, b := range bins {
		fi, err := os.Stat(b)
		if err != nil {
			return true, b + " missing"
		}
		if oldest.IsZero() || fi.ModTime().Before(oldest) {
			oldest = fi.ModTime()
		}
	}
	newer := ""
	for _, dir := range []string{"cmd", "internal", "pkg", "api"} {
		_ = filepath.WalkDir(filepath.Join(node.repo, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || newer != "" || d.IsDir() || !strings.HasSuffix(p, ".go") {
				return nil
			}
			if fi, err := d.Info(); err == nil && fi.ModTime().After(oldest) {
				newer = p
			}
			return nil
		})
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if fi, err := os.Stat(filepath.Join(node.repo, f)); err == nil && fi.ModTime().After(oldest) {
			newer = f
		}
	}
	if newer != "" {
		return true, newer + " is newer than the binaries"
	}
	return false, ""
}

// nodeRunDir is where up.sh writes the node's env, as test/stack/env.sh
// says for this process's environment ($CRI_SHIM_NODE_RUN, $CRI_SHIM_LANE).
func nodeRunDir() (string, error) {
	out, err := exec.Command("bash", "-c", `. "$1" && printf %s "$NODE_RUN"`, "_",
		filepath.Join(node.repo, "test", "stack", "env.sh")).Output()
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("test/stack/env.sh names no NODE_RUN: %v", err)
	}
	return string(out), nil
}

func script(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(node.repo, "test", "stack", name), args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// needNode skips (loudly) when the test node cannot run here.
func needNode(t testing.TB) {
	t.Helper()
	if !node.up {
		t.Skip("SKIPPED: the real node stack could not be used (see the banner); nothing verified")
	}
}

// needKubelet makes sure the standalone kubelet through the shim (up.sh
// --start kubelet) runs, whatever ran before the test: none, or another
// kubelet (native, API-registered, drop-in, reduced decay) in its place, which
// is stopped with its pods first.
func needKubelet(t testing.TB) {
	t.Helper()
	needNode(t)
	if standaloneKubeletRuns() {
		return
	}
	pauseKubelet(t)
	if err := script("up.sh", "--start", "kubelet"); err != nil {
		t.Fatalf("kubelet: %v", err)
	}
}

// standaloneKubeletRuns: the kubelet in $NODE_RUN/kubelet.pid is alive and
// is the one up.sh --start kubelet starts (its kubelet.yaml, no API server).
func standaloneKubeletRuns() bool {
	pid := pidOf("kubelet")
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	config := ""
	for i, a := range args {
		switch {
		case a == "--kubeconfig" || a == "--config-dir":
			return false
		case a == "--config" && i+1 < len(args):
			config = args[i+1]
		}
	}
	return config == filepath.Join(node.env["NODE_RUN"], "kubelet.yaml")
}

// keepRunning starts the named daemons of the node (containerd, cri-shim,
// kubelet) again when the test ends if they are not running, for a test that
// stops or kills one and may fail before starting it again. up.sh --start
// leaves a running daemon alone.
func keepRunning(t testing.TB, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, n := range names {
			if err := script("up.sh", "--start", n); err != nil {
				t.Errorf("starting %s again after the test: %v", n, err)
			}
		}
	})
}

// bin is a program of the node's own bin directory (its pair of containerd
// and kubelet, and the rest of the stack; test/stack/up.sh).
func bin(name string) string { return filepath.Join(node.env["BIN"], name) }

// crictl runs crictl against sock and returns stdout; stderr goes to the error.
func crictl(t testing.TB, sock string, args ...string) (string, error) {
	t.Helper()
	full := append([]string{"--config", "/dev/null", "--runtime-endpoint", "unix://" + sock, "--image-endpoint", "unix://" + sock, "--timeout", "60s"}, args...)
	cmd := exec.Command(bin("crictl"), full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, lastLines(stderr.String(), 5))
	}
	return stdout.String(), nil
}

func mustCrictl(t testing.TB, sock string, args ...string) string {
	t.Helper()
	out, err := crictl(t, sock, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func dial(t testing.TB, sock string) *grpc.ClientConn {
	t.Helper()
	// The kubelet's own limit (16 MiB), so a test reads lists as long as the
	// kubelet can (gRPC's default of 4 MiB fails at about 5,000 containers).
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func runtimeClient(t testing.TB, sock string) runtimeapi.RuntimeServiceClient {
	return runtimeapi.NewRuntimeServiceClient(dial(t, sock))
}

// kubelet is a client of the standalone kubelet's HTTPS API (anonymous, AlwaysAllow).
var kubeletHTTP = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // self-signed serving cert of a local test kubelet
}

func kubeletURL(path string) string {
	return fmt.Sprintf("https://127.0.0.1:%s%s", node.env["KUBELET_PORT"], path)
}

func kubeletDo(t testing.TB, method, path string) (string, error) {
	t.Helper()
	req, err := http.NewRequest(method, kubeletURL(path), nil)
	if err != nil {
		return "", err
	}
	resp, err := kubeletHTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, lastLines(string(b), 3))
	}
	return string(b), nil
}

func kubeletPod(t testing.TB, name string) (*corev1.Pod, error) {
	t.Helper()
	body, err := kubeletDo(t, http.MethodGet, "/pods")
	if err != nil {
		return nil, err
	}
	var pl corev1.PodList
	if err := json.Unmarshal([]byte(body), &pl); err != nil {
		return nil, err
	}
	for i := range pl.Items {
		if pl.Items[i].Name == name {
			return &pl.Items[i], nil
		}
	}
	return nil, fmt.Errorf("pod %s not in kubelet's /pods", name)
}

func eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startRegistry starts the loopback registry with critest's images, once, and
// returns its address for critest's --registry-prefix.
func startRegistry(t testing.TB) string {
	t.Helper()
	node.registryOnce.Do(func() { node.registryErr = script("up.sh", "--start", "registry") })
	if node.registryErr != nil {
		t.Fatalf("registry: %v", node.registryErr)
	}
	return node.env["REGISTRY_ADDR"]
}

// pauseKubelet stops whichever kubelet runs and clears every pod and static
// pod manifest: a node with no kubelet, for the tests that need one (and the
// start of those that run another kubelet). The next needKubelet starts the
// standalone kubelet again.
func pauseKubelet(t testing.TB) {
	t.Helper()
	killPidFile(t, "kubelet", 15)
	for _, dir := range []string{node.env["MANIFESTS"], node.env["MANIFESTS_NATIVE"]} {
		if err := os.RemoveAll(dir); err == nil {
			_ = os.MkdirAll(dir, 0o755)
		}
	}
	clearRuntime(t)
}

// clearRuntime removes every sandbox and then every container left without
// one, straight on containerd. A restart the shim was replaying while the
// sandboxes went can leave a container whose sandbox is gone; "rmp" does not
// see it, and a kubelet later running a pod with the same UID (a static pod
// from the same manifest) stalls on it and never creates its sandbox.
func clearRuntime(t testing.TB) {
	t.Helper()
	_, _ = crictl(t, node.env["CONTAINERD_SOCK"], "rmp", "-fa")
	_, _ = crictl(t, node.env["CONTAINERD_SOCK"], "rm", "-fa")
}
