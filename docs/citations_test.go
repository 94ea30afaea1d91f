package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/config"
)

// What README.md and docs/*.md cite of the repository must exist: every test
// name (TestXxx) a _test.go file declares, every repository path a file or
// directory, every configuration key one of internal/config's toml tags.
// CHANGELOG.md is left out: it records what was, and may name what is gone.

var (
	testName  = regexp.MustCompile(`\bTest[A-Z]\w+`)
	testFunc  = regexp.MustCompile(`(?m)^func (Test[A-Z]\w*)\(`)
	pathLike  = regexp.MustCompile(`[A-Za-z0-9_.{},*-]+(?:/[A-Za-z0-9_.{},*-]+)+/?`)
	lineSufx  = regexp.MustCompile(`(:\d+(-\d+)?)+$`)
	braces    = regexp.MustCompile(`\{([^{}]*)\}`)
	tomlFence = regexp.MustCompile("(?ms)^ {0,3}```toml[^\n]*\n(.*?)^ {0,3}```")
	tomlTable = regexp.MustCompile(`^\s*\[\[?\s*([a-z_.]+)\s*\]\]?\s*(#.*)?$`)
	tomlKey   = regexp.MustCompile(`^\s*([a-z_]+)\s*=`)
	// `[section] key`, `[section]` (a span may go over a line break) and
	// `section.key` name configuration keys; a bare snake_case word could
	// be anything (a CRIU field, a JSON field) and is not checked.
	spanSectionKey = regexp.MustCompile(`^\[([a-z_.]+)\](?:\s+([a-z_]+))?$`)
	spanDottedKey  = regexp.MustCompile(`^([a-z_]+)\.([a-z]+(?:_[a-z]+)*)$`)
)

// citedDocs are the markdown files whose citations are checked, relative to
// the repository root.
func citedDocs(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

// repoTestNames are the Test functions the repository's _test.go files declare.
func repoTestNames(root string) (map[string]bool, error) {
	names := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	return names, err
}

// testNameProblems lists the test names the markdown text cites that no
// _test.go file declares, each once.
func testNameProblems(path, md string, tests map[string]bool) []string {
	var problems []string
	seen := map[string]bool{}
	for _, name := range testName.FindAllString(md, -1) {
		if !tests[name] && !seen[name] {
			problems = append(problems, fmt.Sprintf("%s: %s: no _test.go file declares it", path, name))
		}
		seen[name] = true
	}
	return problems
}

// configKeys are the configuration's tables (top level "") and the keys of
// each, from config.Keys: a list of tables is both a key of its table and a
// table of its own.
func configKeys() map[string]map[string]bool {
	tables := map[string]map[string]bool{"": {}}
	for _, k := range config.Keys() {
		k = strings.ReplaceAll(k, "[]", "")
		i := strings.LastIndex(k, ".")
		table := ""
		if i >= 0 {
			table = k[:i]
		}
		// Every enclosing table exists, with or without keys of its own.
		for p := table; p != ""; {
			if tables[p] == nil {
				tables[p] = map[string]bool{}
			}
			j := strings.LastIndex(p, ".")
			if j < 0 {
				break
			}
			p = p[:j]
		}
		tables[table][k[i+1:]] = true
	}
	return tables
}

// keyProblems lists the configuration keys and tables the markdown text
// cites that the configuration does not have: in toml blocks that are
// cri-shim's (one of their tables is), and in code spans shaped as above.
func keyProblems(path, md string, tables map[string]map[string]bool) []string {
	var problems []string
	has := func(table, key string) bool { return tables[table] != nil && (key == "" || tables[table][key]) }
	for _, m := range tomlFence.FindAllStringSubmatch(md, -1) {
		ours := false
		for _, line := range strings.Split(m[1], "\n") {
			if t := tomlTable.FindStringSubmatch(line); t != nil && has(t[1], "") {
				ours = true
			}
		}
		if !ours {
			continue
		}
		table := ""
		for _, line := range strings.Split(m[1], "\n") {
			if t := tomlTable.FindStringSubmatch(line); t != nil {
				table = t[1]
				if !has(table, "") {
					problems = append(problems, fmt.Sprintf("%s: a toml block names the table [%s], which the configuration does not have", path, table))
				}
				continue
			}
			if k := tomlKey.FindStringSubmatch(line); k != nil && has(table, "") && !has(table, k[1]) {
				problems = append(problems, fmt.Sprintf("%s: a toml block sets %s in [%s], which the configuration does not have", path, k[1], table))
			}
		}
	}
	for _, span := range codeSpan.FindAllString(fence.ReplaceAllString(md, ""), -1) {
		span = strings.Trim(span, "`")
		if m := spanSectionKey.FindStringSubmatch(span); m != nil {
			if !has(m[1], m[2]) {
				problems = append(problems, fmt.Sprintf("%s: `%s`: the configuration has no such %s", path, span, map[bool]string{true: "table", false: "key"}[m[2] == ""]))
			}
			continue
		}
		if m := spanDottedKey.FindStringSubmatch(span); m != nil && tables[m[1]] != nil && m[1] != "" && !has(m[1], m[2]) {
			problems = append(problems, fmt.Sprintf("%s: `%s`: the configuration has no key %s in [%s]", path, span, m[2], m[1]))
		}
	}
	return problems
}

// expand turns a cited path into the patterns it stands for: {a,b}
// alternatives expanded, a trailing Go package pattern (/...) dropped.
func expand(p string) []string {
	p = strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
	m := braces.FindStringSubmatchIndex(p)
	if m == nil {
		return []string{p}
	}
	var out []string
	for _, alt := range strings.Split(p[m[2]:m[3]], ",") {
		out = append(out, expand(p[:m[0]]+alt+p[m[1]:])...)
	}
	return out
}

// sharedTop are the repository's top-level directories whose names upstream
// sources share: containerd's internal/cri, cmd/containerd and api/, the
// kubelet's pkg/kubelet, kubernetes' test/e2e_node.
var sharedTop = map[string]bool{"internal": true, "cmd": true, "pkg": true, "test": true, "api": true}

// goSymbol is a package path followed by one of its names (internal/x.Name).
var goSymbol = regexp.MustCompile(`^(.*/[a-z0-9_]+)\.[A-Z]\w*(\.\w+)*$`)

// repoPath says whether a cited path (braces expanded) is one of the
// repository's, to be checked: its first segment is a top-level entry of the
// repository; below a shared top-level directory, it is a package directory
// (two segments, no extension), a file beside others of its kind, or its
// parent directory exists. Anything else is an upstream source's, cited as
// text.
func repoPath(root, p string, top map[string]bool) bool {
	segs := strings.Split(p, "/")
	if len(segs) < 2 || !top[segs[0]] {
		return false
	}
	if !sharedTop[segs[0]] {
		return true
	}
	if len(segs) == 2 {
		ext := filepath.Ext(segs[1])
		if ext == "" {
			return true
		}
		// A file: the repository's if the directory holds others like it
		// (test/*.sh; internal/ holds no file, so internal/x.go is upstream).
		m, _ := filepath.Glob(filepath.Join(root, segs[0], "*"+ext))
		return len(m) > 0
	}
	m, _ := filepath.Glob(filepath.Join(root, filepath.Dir(p)))
	return len(m) > 0
}

// pathProblems lists the repository paths the markdown text cites (repoPath)
// that do not exist. Absolute paths, URLs and module paths (k8s.io/...) are
// not the repository's; a Go name after a package path (internal/x.Name) is
// dropped, a placeholder (results/churn-<date>.txt) matches anything.
func pathProblems(root, path, md string, top map[string]bool) []string {
	var problems []string
	for _, ix := range pathLike.FindAllStringIndex(md, -1) {
		// A match starts after any character it could include; one after
		// these is the tail of an absolute path, a URL, ~/x, $VAR/x or <var>/x.
		if ix[0] > 0 && strings.ContainsAny(md[ix[0]-1:ix[0]], "/:@~$<>") {
			continue
		}
		p := strings.TrimRight(md[ix[0]:ix[1]], ".,")
		p = lineSufx.ReplaceAllString(p, "")
		if m := goSymbol.FindStringSubmatch(p); m != nil {
			p = m[1]
		}
		if strings.Contains(p, "...") && !strings.HasSuffix(p, "/...") {
			continue
		}
		if ix[1] < len(md) && md[ix[1]] == '<' {
			p += "*"
		}
		for _, e := range expand(p) {
			if !repoPath(root, e, top) {
				continue
			}
			if m, err := filepath.Glob(filepath.Join(root, e)); err != nil || len(m) == 0 {
				problems = append(problems, fmt.Sprintf("%s: %s: no such file or directory in the repository", path, e))
			}
		}
	}
	return problems
}

func TestDocCitationsExist(t *testing.T) {
	root := ".."
	tests, err := repoTestNames(root)
	if err != nil {
		t.Fatal(err)
	}
	if !tests["TestDocCitationsExist"] {
		t.Fatal("the test function pattern no longer finds this test")
	}
	tables := configKeys()
	if !tables["server"]["listen"] || !tables["checkpoint"]["object_wait"] || !tables[""]["state_dir"] {
		t.Fatalf("the configuration's keys as read from its toml tags lack known ones: %v", tables)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") && !strings.HasPrefix(e.Name(), "_") {
			top[e.Name()] = true
		}
	}
	for _, f := range citedDocs(t, root) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		md := string(b)
		for _, p := range slices.Concat(testNameProblems(f, md, tests), pathProblems(root, f, md, top), keyProblems(f, md, tables)) {
			t.Error(p)
		}
	}
}

// The checkers themselves: each kind of stale citation is reported, good
// ones and upstream sources are not.
func TestCitationProblems(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"internal/podx/podx.go", "test/e2e/a_test.go", "test/run.sh", "docs/a.md", "bench/results/churn-20260101.txt", "pkg/apis/v1/types.go"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	top := map[string]bool{"internal": true, "test": true, "docs": true, "bench": true, "pkg": true}
	for _, c := range []problemCase{
		{"see `internal/podx/podx.go` and internal/podx, `test/run.sh`, docs/a.md", ""},
		{"`internal/podx.New` and `internal/podx/{podx.go}` and `internal/podx/...`, test/e2e/a_test.go:12", ""},
		{"`bench/results/churn-<date>.txt`, `docs/*.md`", ""},
		{"upstream: `pkg/kubelet/kubelet.go`, `internal/cri/server/container_start.go`, `internal/oci_image_build.go`", ""},
		{"upstream: `pkg/apis/core/validation/validation.go`, k8s.io/api/core/v1, /usr/local/bin/x, https://example.com/internal/y", ""},
		{"`internal/podx/gone.go`", "internal/podx/gone.go: no such file"},
		{"`internal/gone`", "internal/gone: no such file"},
		{"`test/gone.sh`", "test/gone.sh: no such file"},
		{"see docs/b.md", "docs/b.md: no such file"},
		{"`internal/podx/{podx,gone}.go`", "internal/podx/gone.go: no such file"},
		{"`bench/results/fleet-<date>.txt`", "bench/results/fleet-*: no such file"},
	} {
		wantProblem(t, c.md, c.want, pathProblems(root, "docs/x.md", c.md, top))
	}

	tables := map[string]map[string]bool{"": {"state_dir": true}, "server": {"listen": true}, "checkpoint": {"root": true, "registries": true}, "checkpoint.registries": {"host": true}}
	for _, c := range []problemCase{
		{"```toml\nstate_dir = 'x'\n[server]\nlisten = 'y'\n[[checkpoint.registries]]\nhost = 'z'\n```\n", ""},
		{"`[server] listen`, `[checkpoint]\nroot`, `[server]`, `server.listen`, `checkpoint.cri-shim.io/name`, `pod.name`", ""},
		{"```toml\nversion = 3\n[plugins.'io.containerd.cri.v1.runtime']\nsandbox = 'x'\n```\n", ""},
		{"```toml\n[server]\nlisten = 'y'\nlisten_gone = 'z'\n```\n", "sets listen_gone in [server]"},
		{"```toml\n[server]\n[gone]\nx = 1\n```\n", "names the table [gone]"},
		{"`[server] gone`", "no such key"},
		{"`[checkpoint.gone]`", "no such table"},
		{"`server.gone`", "no key gone in [server]"},
	} {
		wantProblem(t, c.md, c.want, keyProblems("docs/x.md", c.md, tables))
	}

	tests := map[string]bool{"TestThere": true}
	if got := testNameProblems("docs/x.md", "`TestThere`, `TestThere/{a,b}`, TestGone and TestGone", tests); len(got) != 1 || !strings.Contains(got[0], "TestGone") {
		t.Errorf("test name problems %q, want one naming TestGone", got)
	}
}
