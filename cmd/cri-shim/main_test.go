package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/cri-shim/cri-shim/internal/version"
)

// runCaptured runs the CLI and returns its exit code and stderr.
func runCaptured(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, _, stderr := runOut(t, args...)
	return code, stderr
}

// runOut runs the CLI and returns its exit code, stdout and stderr.
func runOut(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := execute(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
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
		code int
		want string
	}{
		{[]string{"serve", "--config", filepath.Join(dir, "absent.toml")}, 1, "no such file"},
		{[]string{"serve", "--config=" + write("typo.toml", "[server]\nlistn = \"/x\"\n")}, 1, "unknown field server.listn"},
		{[]string{"serve", "--config", write("type.toml", "[metrics]\naddress = 9464\n")}, 1, "metrics.address"},
		{[]string{"serve", "--config", write("ok.toml", ""), "--log-level", "chatty"}, 1, "log.level"},
		{[]string{"serve", "--config", write("ok2.toml", ""), "--listen=relative.sock"}, 1, "server.listen"},
		{[]string{"serve", "--config", write("ok3.toml", ""), "--runtime-endpoint", "tcp://x"}, 1, "runtime.endpoint"},
		{[]string{"serve", "--no-such-flag"}, 2, "unknown flag: --no-such-flag"},
		{[]string{"config", "check", "--config", write("bad.toml", "[log]\nformat = \"xml\"\n")}, 1, "log.format"},
		{[]string{"config", "check", write("bad2.toml", "[log]\nformat = \"xml\"\n")}, 1, "log.format"},
		{[]string{"config", "check", filepath.Join(dir, "absent.toml")}, 1, "no such file"},
		{[]string{"config", "check", "--config", write("a.toml", ""), write("b.toml", "")}, 2, "two files to check"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		// Backoff acceptance 4: invalid node maxima refuse to start, naming the field.
		{[]string{"serve", "--config", write("bo0.toml", "[backoff]\nmax_container_restart_period = 0\n")}, 1, "backoff.max_container_restart_period: must be whole seconds from 1 to 300, got 0"},
		{[]string{"serve", "--config", write("bo301.toml", "[backoff]\nmax_container_restart_period = 301\n")}, 1, "backoff.max_container_restart_period: must be whole seconds from 1 to 300, got 301"},
		{[]string{"serve", "--config", write("boabc.toml", "[backoff]\nmax_container_restart_period = \"abc\"\n")}, 1, "backoff.max_container_restart_period"},
	} {
		code, stderr := runCaptured(t, tc.args...)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d (%s)", tc.args, code, tc.code, stderr)
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: stderr %q does not mention %q", tc.args, stderr, tc.want)
		}
		checkOnePrefix(t, tc.args, stderr)
	}
}

// checkOnePrefix fails when an error is printed without the one "cri-shim: "
// prefix, or with it twice.
func checkOnePrefix(t *testing.T, args []string, stderr string) {
	t.Helper()
	if stderr == "" {
		return
	}
	if !strings.HasPrefix(stderr, "cri-shim: ") {
		t.Errorf("%v: stderr %q does not start with \"cri-shim: \"", args, stderr)
	}
	if strings.Count(stderr, "cri-shim: ") > 1 {
		t.Errorf("%v: doubled prefix or message in %q", args, stderr)
	}
	// No context said twice ("config F: config F: open F: ...").
	parts := strings.Split(strings.SplitN(stderr, "\n", 2)[0], ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			t.Errorf("%v: %q said twice in %q", args, parts[i], stderr)
		}
	}
}

func TestConfigCheckAcceptsShippedExample(t *testing.T) {
	for _, args := range [][]string{
		{"config", "check", "--config", "../../deploy/config.toml"},
		{"config", "check", "../../deploy/config.toml"},
		{"config", "check", "-c", "../../deploy/config.toml"},
	} {
		code, out, stderr := runOut(t, args...)
		if code != 0 || out != "../../deploy/config.toml: ok\n" {
			t.Fatalf("%v: %d %q %s", args, code, out, stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"version", "-o", "table"}} {
		code, out, _ := runOut(t, args...)
		if code != 0 || out != version.String()+"\n" {
			t.Fatalf("%v: exit %d, %q", args, code, out)
		}
	}
}

// version -o json|yaml carries every part of the line, under the same keys.
func TestVersionOutput(t *testing.T) {
	defer func(v, r, c string) { version.Version, version.Revision, version.CommitTime = v, r, c }(version.Version, version.Revision, version.CommitTime)
	version.Version, version.Revision, version.CommitTime = "1.2.3", "0123abc", "2026-01-02T03:04:05Z"
	want := versionOutput{Version: "1.2.3", Revision: "0123abc", CommitTime: "2026-01-02T03:04:05Z",
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	for _, format := range []string{"json", "yaml"} {
		code, out, stderr := runOut(t, "version", "-o", format)
		if code != 0 {
			t.Fatalf("-o %s: exit %d: %s", format, code, stderr)
		}
		var got versionOutput
		if err := yaml.Unmarshal([]byte(out), &got); err != nil { // YAML reads JSON too
			t.Fatalf("-o %s: %v: %q", format, err, out)
		}
		if got != want {
			t.Errorf("-o %s: got %+v, want %+v", format, got, want)
		}
		for _, key := range []string{"version", "revision", "modified", "commitTime", "goVersion", "platform"} {
			if !strings.Contains(out, key) {
				t.Errorf("-o %s lacks %s: %s", format, key, out)
			}
		}
	}
	if code, stderr := runCaptured(t, "version", "-o", "xml"); code != 2 || !strings.Contains(stderr, `unknown output format "xml"`) {
		t.Errorf("-o xml: exit %d, %q", code, stderr)
	}
}
