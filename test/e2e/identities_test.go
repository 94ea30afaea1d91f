package e2e

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
)

// clientAs is a PodCheckpoint client of the stack's API server as user in
// groups: a client certificate signed by the stack's CA (test/stack/pki.sh),
// made in memory, as pki.sh makes the kubelet's (/O=<group>/CN=<user>).
func clientAs(t *testing.T, user string, groups ...string) *podcheckpoint.Client {
	t.Helper()
	pki := node.env["PKI"]
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(pki, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		t.Fatalf("%s: the CA's certificate or key is not PEM", pki)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	var caKey any
	if caKey, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
		if caKey, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
			t.Fatalf("the CA's key: %v", err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: user, Organization: groups},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := podcheckpoint.NewClient(&rest.Config{
		Host: "https://127.0.0.1:" + node.env["APISERVER_PORT"],
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM,
			CertData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			KeyData:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
