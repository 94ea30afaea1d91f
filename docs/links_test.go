// Package docs holds the project's documentation; its test checks that every
// link in README.md, CHANGELOG.md and docs/*.md stays inside the repository
// and resolves: a relative link names a file (or directory) of the
// repository, and a #fragment names a heading of that file. Sources outside
// the repository are cited as text (repository and path), never linked.
// citations_test.go checks that the test names, repository paths and
// configuration keys README.md and docs/*.md cite exist.
package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	fence      = regexp.MustCompile("(?ms)^ {0,3}(```|~~~).*?^ {0,3}(```|~~~)[^\n]*$")
	codeSpan   = regexp.MustCompile("`[^`]*`") // a span may go over a line break
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	autoLink   = regexp.MustCompile(`<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>`)
	bareURL    = regexp.MustCompile(`(?i)\b(?:https?://|www\.)[^\s<>)]+`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	heading    = regexp.MustCompile(`(?m)^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	notSlug    = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// prose is a markdown text without its code blocks and code spans, where
// nothing is a link.
func prose(md string) string {
	return codeSpan.ReplaceAllString(fence.ReplaceAllString(md, ""), "")
}

// anchors are the fragment names GitHub gives the headings of a markdown text:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(md, ""), -1) {
		text := strings.NewReplacer("`", "", "*", "").Replace(m[1])
		a := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(text), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// linkProblems lists what is wrong with the links of the markdown file at
// path (relative to root): links that leave the repository, relative links to
// nothing, fragments naming no heading.
func linkProblems(root, path string, md []byte) []string {
	text := prose(string(md))
	var targets []string
	for _, re := range []*regexp.Regexp{inlineLink, refDef, autoLink} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			targets = append(targets, m[1])
		}
	}
	var problems []string
	for _, u := range bareURL.FindAllString(inlineLink.ReplaceAllString(text, ""), -1) {
		problems = append(problems, fmt.Sprintf("%s: %s: a URL leaves the repository (cite the source as text: repository and path)", path, u))
	}
	for _, t := range targets {
		if scheme.MatchString(t) {
			problems = append(problems, fmt.Sprintf("%s: %s: a link leaves the repository (cite the source as text: repository and path)", path, t))
			continue
		}
		file, frag, _ := strings.Cut(t, "#")
		if file == "" {
			if !anchors(string(md))[frag] {
				problems = append(problems, fmt.Sprintf("%s: %s: no heading #%s here", path, t, frag))
			}
			continue
		}
		target := filepath.Join(filepath.Dir(path), file)
		if rel, err := filepath.Rel(".", target); err != nil || strings.HasPrefix(rel, "..") || filepath.IsAbs(file) {
			problems = append(problems, fmt.Sprintf("%s: %s: not a path inside the repository", path, t))
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, target))
		if err != nil {
			if st, serr := os.Stat(filepath.Join(root, target)); serr == nil && st.IsDir() && frag == "" {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s: %s: no such file in the repository", path, t))
			continue
		}
		if frag != "" && strings.HasSuffix(target, ".md") && !anchors(string(b))[frag] {
			problems = append(problems, fmt.Sprintf("%s: %s: %s has no heading #%s", path, t, target, frag))
		}
	}
	return problems
}

func TestDocLinksStayInTheRepository(t *testing.T) {
	root := ".."
	files := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	links := 0
	for _, f := range files {
		md, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		links += len(inlineLink.FindAllString(prose(string(md)), -1))
		for _, p := range linkProblems(root, f, md) {
			t.Error(p)
		}
	}
	if links == 0 {
		t.Fatal("no links found at all: the link pattern no longer matches the docs")
	}
}

// The checker itself: each kind of bad link is reported, good ones are not.
func TestLinkProblems(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "docs"), 0o755)
	os.WriteFile(filepath.Join(root, "docs", "b.md"), []byte("# Title\n## Command line\n## Limits, measured\n"), 0o644)
	os.WriteFile(filepath.Join(root, "main.go"), nil, 0o644)
	for _, c := range []problemCase{
		{"see [b](b.md)", ""},
		{"see [b](b.md#command-line) and [l](b.md#limits-measured)", ""},
		{"see [top](#a) of this\n# A\n", ""},
		{"see [main](../main.go) and [dir](../docs)", ""},
		{"```\n[x](https://example.com) https://example.com\n```\nand `https://127.0.0.1:80/x`", ""},
		{"a `curl -o f\nhttps://127.0.0.1:9464/x` span over a line break", ""},
		{"see [b](https://github.com/x/y/blob/main/b.md)", "leaves the repository"},
		{"see <https://example.com>", "leaves the repository"},
		{"see https://example.com/x for more", "URL leaves the repository"},
		{"[ref]: http://example.com\n", "leaves the repository"},
		{"see [c](c.md)", "no such file"},
		{"see [b](b.md#no-such)", "has no heading #no-such"},
		{"see [top](#b) of this\n# A\n", "no heading #b here"},
		{"see [x](../../etc/passwd)", "not a path inside the repository"},
		{"see [x](/etc/passwd)", "not a path inside the repository"},
	} {
		wantProblem(t, c.md, c.want, linkProblems(root, filepath.Join("docs", "a.md"), []byte(c.md)))
	}
}

// problemCase is a markdown text and what a checker must find in it ("" for
// no problem).
type problemCase struct{ md, want string }

// wantProblem fails the test unless the problems a checker found in md hold
// want, or, with want "", unless there are none.
func wantProblem(t *testing.T, md, want string, problems []string) {
	t.Helper()
	got := strings.Join(problems, "\n")
	if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
		t.Errorf("%q: problems %q, want %q", md, got, want)
	}
}
