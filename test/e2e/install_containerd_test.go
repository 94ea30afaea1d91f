package e2e

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The main-config shapes operators have, as files under /etc/containerd
// (imports name the node's paths, as on a node): shape name to relative path
// to body. They are test/testdata/containerd-shapes's (its README says what
// each is), which the guest's shapes suite (test/vm/guest/shapes.sh) installs
// on a running node too.
var containerdShapes = readContainerdShapes(filepath.Join("..", "testdata", "containerd-shapes"))

// readContainerdShapes reads every shape directory under dir: the files under
// its etc/, by their path relative to the shape directory (a shape without
// etc/ is a node with no containerd config files).
func readContainerdShapes(dir string) map[string]map[string]string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		panic(err) // the repository's own files
	}
	shapes := map[string]map[string]string{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		shape := filepath.Join(dir, e.Name())
		files := map[string]string{}
		err := filepath.WalkDir(filepath.Join(shape, "etc"), func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) && p == filepath.Join(shape, "etc") {
				return filepath.SkipDir
			}
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(shape, p)
			files[filepath.ToSlash(rel)] = string(b)
			return nil
		})
		if err != nil {
			panic(err)
		}
		shapes[e.Name()] = files
	}
	return shapes
}

var runtimePathLine = regexp.MustCompile(`^\s*runtime_path = `)

// containerdDump is containerd's effective config of root's main config, its
// imports moved under root (the test's shapes name /etc/containerd only).
func containerdDump(t *testing.T, ctrd, root string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if b, err := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml")); err == nil {
		s := strings.ReplaceAll(string(b), "'/etc/containerd/", "'"+root+"/etc/containerd/")
		s = strings.ReplaceAll(s, `"/etc/containerd/`, `"`+root+"/etc/containerd/")
		s = strings.ReplaceAll(s, "'site.toml'", "'"+root+"/etc/containerd/site.toml'")
		if err := os.WriteFile(cfg, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(ctrd, "--config", cfg, "config", "dump").Output()
	if err != nil {
		t.Fatalf("%s config dump: %v", ctrd, err)
	}
	return string(out)
}

// changedLines are the lines of a and b that differ, in order (the dumps
// keep their keys in a fixed order, so a line-set difference is the diff),
// except the import list, which names the test's own paths.
func changedLines(a, b string) (gone, added []string) {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "imports = ") {
				m[l]++
			}
		}
		return m
	}
	ca, cb := count(a), count(b)
	for l, n := range ca {
		if cb[l] < n {
			gone = append(gone, l)
		}
	}
	for l, n := range cb {
		if ca[l] < n {
			added = append(added, l)
		}
	}
	return gone, added
}

// deploy/install.sh --with-containerd on every main-config shape and on
// containerd 2.2.9, 2.3.7 and 2.4.2: containerd's own effective config
// (`containerd config dump`) before and after differs in the runc handler's
// runtime_path only (the v2 shapes keep SystemdCgroup and their pause
// image: a version 3 drop-in loses both on 2.2), and the handler runs the
// runtime shim. A second run changes no file.
func TestInstallContainerdConfigShapes(t *testing.T) {
	for _, shape := range []string{"v2", "v2-imports", "v3", "v3-imports", "none"} {
		if _, ok := containerdShapes[shape]; !ok {
			t.Fatalf("no shape %q in test/testdata/containerd-shapes (have %d)", shape, len(containerdShapes))
		}
	}
	bin := installBinaries(t)
	for _, version := range []string{"2.2.9", "2.3.7", "2.4.2"} {
		ctrd := stackContainerd(t, version)
		for name, files := range containerdShapes {
			t.Run(version+"/"+name, func(t *testing.T) {
				root := t.TempDir()
				writeFiles(t, root, files)
				before := containerdDump(t, ctrd, root)
				out, err := runInstall(t, "--binary", bin, "--root", root, "--with-containerd", "--containerd-bin", ctrd)
				if err != nil {
					t.Fatalf("install.sh: %v\n%s", err, out)
				}
				after := containerdDump(t, ctrd, root)
				gone, added := changedLines(before, after)
				if len(gone) != 1 || len(added) != 1 || !runtimePathLine.MatchString(gone[0]) ||
					strings.TrimSpace(added[0]) != "runtime_path = '/usr/local/bin/containerd-shim-cri-shim-v2'" {
					t.Fatalf("the effective config changed in more than runtime_path:\n- %s\n+ %s\ninstall.sh:\n%s",
						strings.Join(gone, "\n- "), strings.Join(added, "\n+ "), out)
				}
				if files["etc/containerd/config.toml"] != "" {
					for _, want := range []string{"SystemdCgroup = true", "registry.example/pause:9.9"} {
						if !strings.Contains(after, want) {
							t.Errorf("after install the effective config lacks %q", want)
						}
					}
				}
				if strings.HasPrefix(name, "v2") {
					if b, _ := os.ReadFile(filepath.Join(root, "etc/containerd/conf.d/50-cri-shim.toml")); !strings.Contains(string(b), "version = 2") {
						t.Errorf("a version 2 main config got a drop-in of another version:\n%s", b)
					}
				}
				tree := treeOf(t, root)
				out, err = runInstall(t, "--binary", bin, "--root", root, "--with-containerd", "--containerd-bin", ctrd)
				if err != nil {
					t.Fatalf("second install.sh: %v\n%s", err, out)
				}
				if again := treeOf(t, root); !sameTree(tree, again) {
					t.Errorf("a second run changed files: %v", treeDiff(tree, again))
				}
			})
		}
	}
}

// install.sh refuses, changing nothing, when the drop-in cannot do its one
// change: a later import of the operator's sets the runc handler's
// runtime_path, so the runtime shim would not be used. --dry-run changes
// nothing and shows the config diff.
func TestInstallContainerdRefuses(t *testing.T) {
	bin := installBinaries(t)
	ctrd := stackContainerd(t, "2.4.2")
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"etc/containerd/config.toml":         "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n",
		"etc/containerd/conf.d/90-site.toml": "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_path = '/opt/site/shim'\n",
	})
	tree := treeOf(t, root)
	out, err := runInstall(t, "--binary", bin, "--root", root, "--with-containerd", "--containerd-bin", ctrd)
	if err == nil || !strings.Contains(out, "not changing containerd's configuration") {
		t.Fatalf("install.sh did not refuse: %v\n%s", err, out)
	}
	if again := treeOf(t, root); !sameTree(tree, again) {
		t.Errorf("a refused install changed files: %v", treeDiff(tree, again))
	}

	dry := t.TempDir()
	writeFiles(t, dry, containerdShapes["v2"])
	tree = treeOf(t, dry)
	out, err = runInstall(t, "--binary", bin, "--root", dry, "--with-containerd", "--containerd-bin", ctrd, "--dry-run")
	if err != nil {
		t.Fatalf("--dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{"a version 2 drop-in", "> runtime_path = '/usr/local/bin/containerd-shim-cri-shim-v2'", "would install /etc/containerd/conf.d/50-cri-shim.toml", "would install /usr/local/bin/cri-shim"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("--dry-run output lacks %q:\n%s", want, out)
		}
	}
	if again := treeOf(t, dry); !sameTree(tree, again) {
		t.Errorf("--dry-run changed files: %v", treeDiff(tree, again))
	}
}

func sameTree(a, b map[string]string) bool { return len(treeDiff(a, b)) == 0 }

// treeDiff names the paths that differ between two trees.
func treeDiff(a, b map[string]string) []string {
	var d []string
	for p, v := range a {
		if w, ok := b[p]; !ok {
			d = append(d, "-"+p)
		} else if v != w {
			d = append(d, "~"+p)
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			d = append(d, "+"+p)
		}
	}
	return d
}
