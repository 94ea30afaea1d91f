package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// Private loopback ports, apart from the e2e node's (test/stack/env.sh).
const (
	etcdPort      = 22379
	etcdPeerPort  = 22380
	apiserverPort = 26443
)

// hostAddress is the host's first global IPv4 address: the API server
// refuses to advertise a loopback one (as test/stack/up.sh's host_address).
func hostAddress() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return "127.0.0.1"
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func safeName(s string) string { return strings.NewReplacer(":", "_", "/", "_").Replace(s) }

// controlPlane is the stack's etcd and kube-apiserver, started for the run.
type controlPlane struct {
	stack, dir string
	host       string
	pki        *pki
	admin      *rest.Config
	adminKC    string
	audit      string
	apiserver  *exec.Cmd
	args       []string
	metrics    *http.Client
}

func stackDir() string {
	if s := os.Getenv("CRI_SHIM_STACK"); s != "" {
		return s
	}
	abs, _ := filepath.Abs("../../.stack")
	return abs
}

func startControlPlane(t testing.TB) *controlPlane {
	t.Helper()
	stack := stackDir()
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(stack, "bin", b)); err != nil {
			t.Fatalf("%s: run make stack first (%v)", b, err)
		}
	}
	dir := t.TempDir()
	cp := &controlPlane{stack: stack, dir: dir, host: fmt.Sprintf("https://127.0.0.1:%d", apiserverPort), pki: newPKI(t, dir)}
	scrt, skey := cp.pki.sign(t, "kube-apiserver", nil, true)
	cp.pki.write(t, "apiserver.crt", scrt)
	cp.pki.write(t, "apiserver.key", skey)
	// The service-account key pair (ECDSA; the API server signs ES256).
	sacrt, sakey := cp.pki.sign(t, "service-accounts", nil, false)
	_ = sacrt
	cp.pki.write(t, "sa.key", sakey)
	cp.admin, cp.adminKC = cp.pki.client(t, cp.host, "fleet-admin", []string{"system:masters"})
	cp.audit = filepath.Join(dir, "audit.log")
	cp.pki.write(t, "audit-policy.yaml", []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"))

	etcd := exec.Command(filepath.Join(stack, "bin", "etcd"), "--name", "fleet", "--data-dir", filepath.Join(dir, "etcd"), "--unsafe-no-fsync",
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPort), "--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort), "--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort),
		"--initial-cluster", fmt.Sprintf("fleet=http://127.0.0.1:%d", etcdPeerPort), "--quota-backend-bytes", "8589934592")
	startLogged(t, etcd, filepath.Join(dir, "etcd.log"))
	cp.args = []string{"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--bind-address", "127.0.0.1", "--advertise-address", hostAddress(), "--secure-port", fmt.Sprint(apiserverPort),
		"--tls-cert-file", filepath.Join(dir, "apiserver.crt"), "--tls-private-key-file", filepath.Join(dir, "apiserver.key"),
		"--client-ca-file", filepath.Join(dir, "ca.crt"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.key"), "--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--audit-policy-file", filepath.Join(dir, "audit-policy.yaml"), "--audit-log-path", cp.audit, "--audit-log-format", "json",
		"--audit-log-maxsize", "0"}
	cp.startAPIServer(t)
	t.Cleanup(func() {
		cp.stopAPIServer(syscall.SIGTERM)
		_ = etcd.Process.Kill()
		_, _ = etcd.Process.Wait()
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.pki.caPEM)
	cert, _ := tls.X509KeyPair(cp.admin.CertData, cp.admin.KeyData)
	cp.metrics = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	cp.waitReady(t, 90*time.Second)
	for _, d := range []string{"deploy/crd"} {
		cp.kubectl(t, "apply", "-f", "../../"+d)
	}
	cp.kubectl(t, "wait", "--for", "condition=Established", "--timeout", "60s", "-f", "../../deploy/crd")
	cp.kubectl(t, "apply", "-f", "../../deploy/rbac", "-f", "../../deploy/admission")
	return cp
}

func startLogged(t testing.TB, c *exec.Cmd, log string) {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	c.Stdout, c.Stderr = f, f
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
}

func (cp *controlPlane) startAPIServer(t testing.TB) {
	t.Helper()
	cp.apiserver = exec.Command(filepath.Join(cp.stack, "bin", "kube-apiserver"), cp.args...)
	startLogged(t, cp.apiserver, filepath.Join(cp.dir, "kube-apiserver.log"))
}

func (cp *controlPlane) stopAPIServer(sig syscall.Signal) {
	if cp.apiserver == nil || cp.apiserver.Process == nil {
		return
	}
	_ = cp.apiserver.Process.Signal(sig)
	_, _ = cp.apiserver.Process.Wait()
	cp.apiserver = nil
}

func (cp *controlPlane) waitReady(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := cp.metrics.Get(cp.host + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(cp.dir, "kube-apiserver.log"))
			t.Fatalf("kube-apiserver not ready within %s: %v\n%s", within, err, tail(string(b), 3000))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (cp *controlPlane) kubectl(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(cp.stack, "bin", "kubectl"), append([]string{"--kubeconfig", cp.adminKC}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// scrape returns the API server's /metrics text.
func (cp *controlPlane) scrape(t testing.TB) string {
	t.Helper()
	resp, err := cp.metrics.Get(cp.host + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pid is the API server's process id.
func (cp *controlPlane) pid() int { return cp.apiserver.Process.Pid }
