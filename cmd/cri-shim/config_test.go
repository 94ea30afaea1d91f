package main

import (
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/config"
)

// `config default` prints config.Marshal of the defaults (whose keys
// internal/config's TestDefaultAndShippedExampleShowEveryKey compares with
// the struct and deploy/config.toml), and `config check` accepts it.
func TestConfigDefaultRoundTripsThroughCheck(t *testing.T) {
	code, out, stderr := runOut(t, "config", "default")
	if code != 0 || stderr != "" {
		t.Fatalf("config default: exit %d, %s", code, stderr)
	}
	want, err := config.Marshal(config.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Fatalf("config default printed something else than config.Marshal of the defaults:\n%s", out)
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = runOut(t, "config", "check", p)
	if code != 0 || out != p+": ok\n" {
		t.Fatalf("config check of config default: exit %d, %q %s", code, out, stderr)
	}
}

// 'config check' refuses what 'serve' refuses to start with, with the same
// message (they call one check), and accepts what serve starts with.
func TestConfigCheckRefusesWhatServeRefuses(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	srv.Close()
	ca := filepath.Join(dir, "ca.pem")
	notPEM := filepath.Join(dir, "not.pem")
	auth := filepath.Join(dir, "auth.json")
	for p, body := range map[string][]byte{
		ca:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}),
		notPEM: []byte("not a certificate\n"),
		auth:   []byte(`{"auths":{}}`),
	} {
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	registry := func(extra string) string {
		return "[[checkpoint.registries]]\nhost = \"r.example\"\nnamespaces = [\"*\"]\n" + extra
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"unknown socket group", "[server]\nsocket_group = \"no-such-group-h43\"\n", `server.socket_group: group: unknown group no-such-group-h43`},
		{"negative socket gid", "[server]\nsocket_group = \"-5\"\n", "server.socket_group: negative gid -5"},
		{"metrics address without port", "[metrics]\naddress = \"127.0.0.1\"\n", `metrics.address: must be host:port like "127.0.0.1:9464" or empty (disabled), got "127.0.0.1"`},
		{"metrics port not a number", "[metrics]\naddress = \"127.0.0.1:metrics\"\n", `metrics.address: port "metrics" must be a number from 1 to 65535`},
		{"metrics port too large", "[metrics]\naddress = \"127.0.0.1:70000\"\n", `metrics.address: port "70000" must be a number`},
		{"metrics host unknown", "[metrics]\naddress = \"no-such-host.invalid:9464\"\n", `metrics.address: host "no-such-host.invalid"`},
		{"profiling on every IPv4 interface", "[metrics]\naddress = \"0.0.0.0:9464\"\nprofiling = true\n", `metrics.profiling: serves /debug/pprof on metrics.address "0.0.0.0:9464", which is not a loopback address`},
		{"profiling on every interface", "[metrics]\naddress = \":9464\"\nprofiling = true\n", `metrics.profiling: serves /debug/pprof on metrics.address ":9464"`},
		{"profiling on a routable address", "[metrics]\naddress = \"10.1.2.3:9464\"\nprofiling = true\n", "metrics.profiling"},
		{"missing ca_file", registry("ca_file = \"" + filepath.Join(dir, "absent.pem") + "\"\n"), "checkpoint.registries[0].ca_file: CA file: open " + filepath.Join(dir, "absent.pem") + ": no such file or directory"},
		{"ca_file without a certificate", registry("ca_file = \"" + notPEM + "\"\n"), "checkpoint.registries[0].ca_file: CA file " + notPEM + " holds no PEM certificate"},
		{"missing registry_auth_file", "[checkpoint]\nregistry_auth_file = \"" + filepath.Join(dir, "absent.json") + "\"\n", "checkpoint.registry_auth_file: registry config: open " + filepath.Join(dir, "absent.json")},
		{"every value that serves", "[server]\nsocket_group = \"0\"\n[metrics]\naddress = \"localhost:9464\"\nprofiling = true\n[checkpoint]\nregistry_auth_file = \"" + auth + "\"\n" +
			"[[checkpoint.registries]]\nhost = \"r.example\"\nnamespaces = [\"*\"]\nca_file = \"" + ca + "\"\n", ""},
		{"profiling on IPv6 loopback", "[server]\nsocket_group = \"root\"\n[metrics]\naddress = \"[::1]:9464\"\nprofiling = true\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, stderr := runOut(t, "config", "check", p)
			if tc.want == "" {
				if code != 0 || out != p+": ok\n" {
					t.Fatalf("config check: exit %d, %q %s", code, out, stderr)
				}
				return
			}
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("config check: exit %d, stderr %q, want %q", code, stderr, tc.want)
			}
			checkOnePrefix(t, []string{"config", "check", p}, stderr)
			// serve stops at the same check, before it opens anything.
			code, stderr = runCaptured(t, "serve", "--config", p)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("serve: exit %d, stderr %q, want %q", code, stderr, tc.want)
			}
		})
	}
}
