package ociartifact

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	shimconfig "github.com/cri-shim/cri-shim/internal/config"
)

// Registry says how to reach a registry. The zero value uses the node's
// docker-style credentials (authn.DefaultKeychain: $DOCKER_CONFIG or
// ~/.docker/config.json) and TLS verified against the system roots.
type Registry struct {
	// Config is a docker config.json whose "auths" (and credential helpers)
	// are used instead of the default keychain (e.g. the kubelet's
	// /var/lib/kubelet/config.json).
	Config string
	// Keychain, when set, resolves credentials instead of Config and the
	// default keychain (a restore's pod secrets before the node's).
	Keychain authn.Keychain
	// CAFile is a PEM bundle trusted in addition to the system roots.
	CAFile string
	// PlainHTTP allows plain HTTP, only to a loopback registry.
	PlainHTTP bool
	// Transport replaces the HTTP transport (tests); TLS settings above are
	// then not applied, the plain-HTTP guard is.
	Transport http.RoundTripper
	// Progress, if not nil, receives go-containerregistry's byte counts.
	Progress chan<- v1.Update
}

// parseRef parses an operator-given reference. A plain-HTTP reference must
// name a loopback registry.
func (r Registry) parseRef(s string) (name.Reference, error) {
	var opts []name.Option
	if r.PlainHTTP {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(s, append(opts, name.StrictValidation)...)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %w", s, err)
	}
	if r.PlainHTTP && !loopback(ref.Context().RegistryStr()) {
		return nil, fmt.Errorf("plain HTTP is allowed only to a loopback registry, not %s", ref.Context().RegistryStr())
	}
	return ref, nil
}

// loopback reports whether a registry host[:port] is localhost or a
// loopback address.
func loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	return shimconfig.Loopback(host)
}

// connect parses ref and returns the options of every request to its
// registry.
func (r Registry) connect(ctx context.Context, ref string) (name.Reference, []remote.Option, error) {
	parsed, err := r.parseRef(ref)
	if err != nil {
		return nil, nil, err
	}
	opts, err := r.options(ctx)
	return parsed, opts, err
}

// LoadKeychain is the keychain of a docker config.json file (its "auths"
// and credential helpers); "" is authn.DefaultKeychain ($DOCKER_CONFIG or
// ~/.docker/config.json). The file is operator-given: its credential helpers
// run.
func LoadKeychain(path string) (authn.Keychain, error) {
	if path == "" {
		return authn.DefaultKeychain, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("registry config: %w", err)
	}
	cf, err := config.LoadFromReader(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("registry config %s: %w", path, err)
	}
	return fileKeychain{cf: cf}, nil
}

func (r Registry) options(ctx context.Context) ([]remote.Option, error) {
	kc := r.Keychain
	if kc == nil {
		var err error
		if kc, err = LoadKeychain(r.Config); err != nil {
			return nil, err
		}
	}
	rt := r.Transport
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if r.CAFile != "" {
			if err := AppendCAFile(pool, r.CAFile); err != nil {
				return nil, err
			}
		}
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		rt = t
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(plainGuard{rt: rt, allow: r.PlainHTTP}),
		remote.WithUserAgent("cri-shim"),
	}
	if r.Progress != nil {
		opts = append(opts, remote.WithProgress(r.Progress))
	}
	return opts, nil
}

// AppendCAFile adds the certificates of the PEM bundle at path (a
// registry's ca_file, --ca-file) to pool; a file with none is an error.
func AppendCAFile(pool *x509.CertPool, path string) error {
	pem, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("CA file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return nil
}

// plainGuard keeps a registry connection to the scheme it was given: plain
// HTTP only when allowed, and then only to loopback; HTTPS never when plain
// HTTP is. go-containerregistry falls back to HTTP by itself for loopback and
// private (RFC 1918) registries, and for a registry it is told is insecure
// tries HTTPS first (pkg/v1/remote/transport/ping.go, Ping); refused here,
// its HTTPS attempt fails before any connection and it goes on with HTTP.
type plainGuard struct {
	rt    http.RoundTripper
	allow bool
}

var (
	errPlainHTTP = errors.New("plain HTTP refused (use --plain-http, for a loopback registry only)")
	errHTTPS     = errors.New("HTTPS not tried: plain HTTP was asked for")
)

func (g plainGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && (!g.allow || !loopback(req.URL.Host)) {
		return nil, fmt.Errorf("%s: %w", req.URL.Host, errPlainHTTP)
	}
	if req.URL.Scheme == "https" && g.allow {
		return nil, fmt.Errorf("%s: %w", req.URL.Host, errHTTPS)
	}
	resp, err := g.rt.RoundTrip(req)
	if err == nil && strings.Contains(req.URL.Path, "/manifests/") {
		// go-containerregistry reads a manifest whole (up to 100 MiB)
		// before its digest is checked; no manifest of a checkpoint is
		// larger than an index may be.
		resp.Body = &cappedBody{rc: resp.Body, left: maxIndexBytes}
	}
	return resp, err
}

// cappedBody fails a response body longer than left bytes.
type cappedBody struct {
	rc   io.ReadCloser
	left int64
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errManifestTooLarge
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.rc.Read(p)
	if c.left -= int64(n); c.left < 0 {
		return 0, errManifestTooLarge
	}
	return n, err
}

func (c *cappedBody) Close() error { return c.rc.Close() }

var errManifestTooLarge = fmt.Errorf("manifest response larger than %d bytes", maxIndexBytes)

// fileKeychain resolves credentials from one docker config file (its
// "auths" and credential helpers), the way authn.DefaultKeychain reads the
// default one.
type fileKeychain struct{ cf *configfile.ConfigFile }

func (k fileKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	for _, key := range []string{target.String(), target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		c, err := k.cf.GetAuthConfig(key)
		if err != nil {
			return nil, err
		}
		if c.Username != "" || c.Password != "" || c.Auth != "" || c.IdentityToken != "" || c.RegistryToken != "" {
			return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, Auth: c.Auth,
				IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken}), nil
		}
	}
	return authn.Anonymous, nil
}
