package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCaptured runs the CLI and returns its exit code and stderr.
func runCaptured(t *testing.T, args ...string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	code := run(args)
	os.Stderr = old
	w.Close()
	b, _ := io.ReadAll(r)
	return code, string(b)
}

func TestServeRefusesBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--config", filepath.Join(dir, "absent.toml")}, "no such file"},
		{[]string{"serve", "--config", write("typo.toml", "[server]\nlistn = \"/x\"\n")}, "unknown field server.listn"},
		{[]string{"serve", "--config", write("type.toml", "[metrics]\naddress = 9464\n")}, "metrics.address"},
		{[]string{"serve", "--config", write("ok.toml", ""), "--log-level", "chatty"}, "log.level"},
		{[]string{"serve", "--config", write("ok2.toml", ""), "--listen", "relative.sock"}, "server.listen"},
		{[]string{"serve", "--config", write("ok3.toml", ""), "--runtime-endpoint", "tcp://x"}, "runtime.endpoint"},
		{[]string{"serve", "--no-such-flag"}, "flag provided but not defined"},
		{[]string{"config", "check", "--config", write("bad.toml", "[log]\nformat = \"xml\"\n")}, "log.format"},
		{[]string{"frobnicate"}, "unknown command"},
		// Backoff acceptance 4: invalid node maxima refuse to start, naming the field.
		{[]string{"serve", "--config", write("bo0.toml", "[backoff]\nmax_container_restart_period = 0\n")}, "backoff.max_container_restart_period: must be whole seconds from 1 to 300, got 0"},
		{[]string{"serve", "--config", write("bo301.toml", "[backoff]\nmax_container_restart_period = 301\n")}, "backoff.max_container_restart_period: must be whole seconds from 1 to 300, got 301"},
		{[]string{"serve", "--config", write("boabc.toml", "[backoff]\nmax_container_restart_period = \"abc\"\n")}, "backoff.max_container_restart_period"},
	} {
		code, stderr := runCaptured(t, tc.args...)
		if code == 0 {
			t.Errorf("%v: exit 0", tc.args)
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: stderr %q does not mention %q", tc.args, stderr, tc.want)
		}
	}
}

func TestConfigCheckAcceptsShippedExample(t *testing.T) {
	if code, stderr := runCaptured(t, "config", "check", "--config", "../../deploy/config.toml"); code != 0 {
		t.Fatalf("deploy/config.toml: %d %s", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	if code := run([]string{"version"}); code != 0 {
		t.Fatalf("version exit %d", code)
	}
}
