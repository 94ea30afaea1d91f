package ociartifact

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
)

// A TLS registry is trusted through --ca-file and not without it.
func TestTLSRegistryTrustedThroughCAFile(t *testing.T) {
	srv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	must(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	ref := strings.TrimPrefix(srv.URL, "https://") + "/cp/web:v1"
	root := t.TempDir()
	src := twoContainers(t, root, "src")
	if _, err := Push(context.Background(), src, ref, Registry{}, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("push to an untrusted TLS registry: %v", err)
	}
	if _, err := Push(context.Background(), src, ref, Registry{CAFile: ca}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Pull(context.Background(), ref, Registry{CAFile: ca}, PullOptions{Root: root, Name: "copy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Push(context.Background(), src, ref, Registry{CAFile: src + "/" + "manifest.json"}, nil); err == nil {
		t.Error("a CA file without a certificate was accepted")
	}
}

// Credentials come from the docker config given with --registry-config.
func TestCredentialsFromRegistryConfig(t *testing.T) {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "node" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	cfg := filepath.Join(t.TempDir(), "config.json")
	must(t, os.WriteFile(cfg, []byte(`{"auths":{"`+host+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("node:s3cret"))+`"}}}`), 0o600))
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no default credentials
	t.Setenv("HOME", t.TempDir())
	src := twoContainers(t, t.TempDir(), "src")
	if _, err := Push(context.Background(), src, host+"/cp/web:v1", Registry{PlainHTTP: true}, nil); err == nil {
		t.Fatal("push without credentials succeeded")
	}
	if _, err := Push(context.Background(), src, host+"/cp/web:v1", Registry{PlainHTTP: true, Config: cfg}, nil); err != nil {
		t.Fatal(err)
	}
}

// With PlainHTTP nothing is tried over HTTPS, not even go-containerregistry's
// first ping of an insecure registry: a TLS-only registry is not reached.
func TestPlainHTTPNeverTriesHTTPS(t *testing.T) {
	srv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	must(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	ref := strings.TrimPrefix(srv.URL, "https://") + "/cp/web:v1"
	src := twoContainers(t, t.TempDir(), "src")
	if _, err := Push(context.Background(), src, ref, Registry{CAFile: ca}, nil); err != nil {
		t.Fatalf("push over TLS (the control): %v", err)
	}
	_, err := Pull(context.Background(), ref, Registry{CAFile: ca, PlainHTTP: true}, PullOptions{Root: t.TempDir(), Name: "copy"})
	if err == nil || !strings.Contains(err.Error(), "HTTPS not tried: plain HTTP was asked for") {
		t.Fatalf("pull with PlainHTTP from a TLS registry: %v", err)
	}
}
