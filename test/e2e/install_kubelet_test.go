package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// kubeadm's kubelet unit as the kubernetes packages install it: kubelet.service
// and the drop-in 10-kubeadm.conf (kubernetes/release,
// cmd/krel/templates/latest/kubelet/kubelet.service and
// cmd/krel/templates/latest/kubeadm/10-kubeadm.conf; the RPM flavour reads
// /etc/sysconfig/kubelet instead of /etc/default/kubelet), with the files
// kubeadm init/join write.
// The files are test/testdata/kubeadm's, which the guest node (test/vm)
// installs too.
func kubeadmNode(envFile string) map[string]string {
	return map[string]string{
		"usr/lib/systemd/system/kubelet.service": kubeadmFile("kubelet.service"),
		"usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": strings.Replace(kubeadmFile("10-kubeadm.conf"),
			"EnvironmentFile=-/etc/default/kubelet", "EnvironmentFile=-"+envFile, 1),
		"var/lib/kubelet/kubeadm-flags.env": `KUBELET_KUBEADM_ARGS="--node-ip=10.0.0.5 --pod-infra-container-image=registry.k8s.io/pause:3.10"` + "\n",
		"var/lib/kubelet/config.yaml": `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///var/run/containerd/containerd.sock
`,
	}
}

// kubeadmFile reads one of the kubelet package's files from test/testdata/kubeadm.
func kubeadmFile(name string) string {
	b, err := os.ReadFile(filepath.Join("..", "testdata", "kubeadm", name))
	if err != nil {
		panic(err) // the repository's own file
	}
	return string(b)
}

// systemdUnitDirs: systemd's load path for system units, highest priority
// first (systemd.unit(5)).
var systemdUnitDirs = []string{"etc/systemd/system", "run/systemd/system", "usr/local/lib/systemd/system", "usr/lib/systemd/system", "lib/systemd/system"}

// composeKubelet builds the kubelet's command line under root as systemd
// would start it, written here from systemd's documented rules and not from
// install.sh: the unit from the first directory that has it, then the
// drop-ins of all directories by name (a higher-priority directory's file
// hiding a same-named one); in [Service], an empty ExecStart= resets it;
// Environment= assignments in order, then EnvironmentFile= files in order,
// which override them (systemd.exec(5)); on ExecStart=, "$VAR" as a word is
// split at whitespace into zero or more arguments, "${VAR}" is one argument.
func composeKubelet(t *testing.T, root string) []string {
	t.Helper()
	var unit string
	dropins := map[string]string{}
	for _, d := range systemdUnitDirs {
		if p := filepath.Join(root, d, "kubelet.service"); unit == "" && fileExists(p) {
			unit = p
		}
		ms, _ := filepath.Glob(filepath.Join(root, d, "kubelet.service.d", "*.conf"))
		for _, m := range ms {
			if _, seen := dropins[filepath.Base(m)]; !seen {
				dropins[filepath.Base(m)] = m
			}
		}
	}
	if unit == "" {
		t.Fatal("no kubelet.service")
	}
	names := make([]string, 0, len(dropins))
	for n := range dropins {
		names = append(names, n)
	}
	sort.Strings(names)
	files := []string{unit}
	for _, n := range names {
		files = append(files, dropins[n])
	}
	env := map[string]string{}
	var envFiles []string
	exec := ""
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		section := ""
		for _, line := range strings.Split(strings.ReplaceAll(string(b), "\\\n", " "), "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "[") {
				section = line
				continue
			}
			key, val, found := strings.Cut(line, "=")
			if section != "[Service]" || !found || strings.HasPrefix(line, "#") {
				continue
			}
			switch key {
			case "ExecStart":
				exec = val
			case "Environment":
				for _, w := range shellWords(val) {
					if k, v, ok := strings.Cut(w, "="); ok {
						env[k] = v
					}
				}
			case "EnvironmentFile":
				envFiles = append(envFiles, val)
			}
		}
	}
	for _, ef := range envFiles {
		optional := strings.HasPrefix(ef, "-")
		b, err := os.ReadFile(filepath.Join(root, strings.TrimPrefix(ef, "-")))
		if err != nil {
			if optional {
				continue
			}
			t.Fatalf("EnvironmentFile=%s: %v", ef, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
				continue
			}
			if k, v, ok := strings.Cut(line, "="); ok {
				if w := shellWords(v); len(w) == 1 {
					v = w[0]
				} else {
					v = strings.Trim(v, `"'`)
				}
				env[strings.TrimSpace(k)] = v
			}
		}
	}
	if exec == "" {
		t.Fatal("no ExecStart=")
	}
	braced := regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	var args []string
	for _, w := range shellWords(exec) {
		if strings.HasPrefix(w, "$") && !strings.HasPrefix(w, "${") {
			args = append(args, strings.Fields(env[w[1:]])...)
			continue
		}
		args = append(args, braced.ReplaceAllStringFunc(w, func(m string) string { return env[m[2:len(m)-1]] }))
	}
	return args
}

// shellWords splits s at unquoted whitespace, taking quotes off.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// kubeletEndpoint resolves the runtime endpoint of a kubelet command line
// under root: the flag, else the last of --config then the --config-dir
// drop-ins (lexical) that sets it, else the kubelet's default.
func kubeletEndpoint(t *testing.T, root string, args []string) string {
	t.Helper()
	flag := func(name string) string {
		v := ""
		for i, a := range args {
			if s, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				v = s
			} else if a == "--"+name && i+1 < len(args) {
				v = args[i+1]
			}
		}
		return v
	}
	if v := flag("container-runtime-endpoint"); v != "" {
		return v
	}
	ep := "unix:///run/containerd/containerd.sock"
	var files []string
	if c := flag("config"); c != "" {
		files = append(files, c)
	}
	if d := flag("config-dir"); d != "" {
		filepath.WalkDir(filepath.Join(root, d), func(p string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() && strings.HasSuffix(p, ".conf") {
				rel, _ := filepath.Rel(root, p)
				files = append(files, "/"+rel)
			}
			return nil
		})
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if v, ok := m["containerRuntimeEndpoint"].(string); ok {
			ep = v
		}
	}
	return ep
}

// doctorOnFakeProc runs `cri-shim doctor --only kubelet` against a /proc
// holding one kubelet with args, its files under root.
func doctorOnFakeProc(t *testing.T, bin, root string, args []string) (string, error) {
	t.Helper()
	proc := t.TempDir()
	pid := filepath.Join(proc, strconv.Itoa(4242))
	if err := os.MkdirAll(pid, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, pid, map[string]string{"comm": "kubelet\n", "cmdline": strings.Join(args, "\x00") + "\x00"})
	if err := os.Symlink(root, filepath.Join(pid, "root")); err != nil {
		t.Fatal(err)
	}
	repo, _ := filepath.Abs("../..")
	out, err := exec.Command(bin, "doctor", "--only", "kubelet", "--config", filepath.Join(repo, "deploy/config.toml"),
		"--proc", proc, "--host-root", root).CombinedOutput()
	return string(out), err
}

const shimEndpoint = "unix:///run/cri-shim/cri-shim.sock"

// deploy/install.sh --with-kubelet on a root that mimics a kubeadm node,
// whatever its environment files hold (the kubelet package's empty
// KUBELET_EXTRA_ARGS= undid the old Environment= drop-in): the kubelet's
// command line as systemd composes it reads the shim's drop-in and its
// configuration names the shim, the operator's own arguments are kept, and
// `cri-shim doctor` on that command line passes; before the install it fails.
func TestInstallKubeletKubeadmUnit(t *testing.T) {
	bin := installBinaries(t)
	for _, c := range []struct {
		name, envFile, env string
		dropDir            string // where the configuration drop-in must land
		keep               string // an argument of the operator's that must survive
	}{
		{"no /etc/default/kubelet", "/etc/default/kubelet", "", "/etc/kubernetes/kubelet.conf.d", "--node-ip=10.0.0.5"},
		{"empty KUBELET_EXTRA_ARGS", "/etc/default/kubelet", "KUBELET_EXTRA_ARGS=\n", "/etc/kubernetes/kubelet.conf.d", "--node-ip=10.0.0.5"},
		{"KUBELET_EXTRA_ARGS with flags", "/etc/default/kubelet", "KUBELET_EXTRA_ARGS=\"--node-labels=zone=a --v=2\"\n", "/etc/kubernetes/kubelet.conf.d", "--node-labels=zone=a"},
		{"RPM /etc/sysconfig/kubelet", "/etc/sysconfig/kubelet", "KUBELET_EXTRA_ARGS=\n", "/etc/kubernetes/kubelet.conf.d", "--node-ip=10.0.0.5"},
		{"a --config-dir of its own", "/etc/default/kubelet", "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubelet.d\n", "/etc/kubelet.d", "--config-dir=/etc/kubelet.d"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			files := kubeadmNode(c.envFile)
			if c.env != "" {
				files[strings.TrimPrefix(c.envFile, "/")] = c.env
			}
			writeFiles(t, root, files)
			args := composeKubelet(t, root)
			if ep := kubeletEndpoint(t, root, args); ep == shimEndpoint {
				t.Fatalf("before install the kubelet already names the shim: %q", args)
			}
			if out, err := doctorOnFakeProc(t, bin, root, args); err == nil || !strings.Contains(out, "[FAIL] kubelet") {
				t.Errorf("doctor passed a kubelet on containerd: %v\n%s", err, out)
			}
			out, err := runInstall(t, "--binary", bin, "--root", root, "--with-kubelet")
			if err != nil {
				t.Fatalf("install.sh: %v\n%s", err, out)
			}
			args = composeKubelet(t, root)
			if ep := kubeletEndpoint(t, root, args); ep != shimEndpoint {
				t.Fatalf("after install the kubelet's endpoint is %q, not the shim's; command line %q\ninstall.sh:\n%s", ep, args, out)
			}
			if !fileExists(filepath.Join(root, c.dropDir, "50-cri-shim.conf")) {
				t.Errorf("no 50-cri-shim.conf in %s", c.dropDir)
			}
			joined := strings.Join(args, " ")
			for _, want := range []string{c.keep, "--config=/var/lib/kubelet/config.yaml", "--kubeconfig=/etc/kubernetes/kubelet.conf"} {
				if !strings.Contains(joined, want) {
					t.Errorf("the composed command line lost %q: %s", want, joined)
				}
			}
			if n := strings.Count(joined, "--config-dir="); n != 1 {
				t.Errorf("--config-dir given %d times: %s", n, joined)
			}
			if out, err := doctorOnFakeProc(t, bin, root, args); err != nil || !strings.Contains(out, "[ OK ] kubelet") {
				t.Errorf("doctor on the installed kubelet: %v\n%s", err, out)
			}
		})
	}
}
