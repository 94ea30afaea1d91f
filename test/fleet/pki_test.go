package fleet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// pki is the harness's CA and what it signs: ECDSA keys, made in
// milliseconds (openssl's RSA keys for 500 nodes would take minutes).
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	serial int64
}

func newPKI(t testing.TB, dir string) *pki {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cri-shim-fleet-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{dir: dir, ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), serial: 1}
	p.write(t, "ca.crt", p.caPEM)
	return p
}

func (p *pki) write(t testing.TB, name string, b []byte) string {
	t.Helper()
	f := filepath.Join(p.dir, name)
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// sign returns a certificate and key (PEM) for cn in the groups orgs; a
// server certificate for 127.0.0.1 when server is set.
func (p *pki) sign(t testing.TB, cn string, orgs []string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// client is a client-go config for cn, and a kubeconfig file of it (the
// shim's API client loads its kubeconfig from a file).
func (p *pki) client(t testing.TB, host, cn string, orgs []string) (*rest.Config, string) {
	t.Helper()
	cert, key := p.sign(t, cn, orgs, false)
	cfg := &rest.Config{Host: host, TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM, CertData: cert, KeyData: key}}
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: fleet\n  cluster:\n    server: " + host +
		"\n    certificate-authority-data: " + b64(p.caPEM) +
		"\nusers:\n- name: u\n  user:\n    client-certificate-data: " + b64(cert) + "\n    client-key-data: " + b64(key) +
		"\ncontexts:\n- name: c\n  context: {cluster: fleet, user: u}\ncurrent-context: c\n"
	return cfg, p.write(t, safeName(cn)+".kubeconfig", []byte(kc))
}
