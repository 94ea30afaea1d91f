package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// The kubelet's own default runtime endpoint, taken when neither a flag nor
// a configuration file names one (k8s.io/kubernetes
// pkg/kubelet/apis/config/v1beta1/defaults.go, SetDefaults_KubeletConfiguration).
const kubeletDefaultEndpoint = "unix:///run/containerd/containerd.sock"

// kubeletFileMax bounds what doctor reads of a kubelet configuration file.
const kubeletFileMax = 1 << 20

// kubeletEndpoints is where a kubelet takes its runtime and image endpoints
// from, and what they are.
type kubeletEndpoints struct {
	runtime, image         string
	runtimeFrom, imageFrom string
}

// checkKubelet checks that the running kubelet uses the shim's socket: its
// command line (from procRoot, /proc) and the configuration files it names,
// read the way the kubelet merges them. With several kubelets (test beds),
// one on the shim's socket passes. With none running it falls back to the
// files of a kubeadm node under root and can only warn.
func checkKubelet(procRoot, root, listen string) finding {
	sock := endpointPath(listen)
	pids := kubeletPIDs(procRoot)
	if len(pids) == 0 {
		f := checkKubeletFiles(root, listen)
		f.detail = "no kubelet running; " + f.detail
		f.level = min(f.level, warn)
		return f
	}
	var others []string
	for _, pid := range pids {
		ep, err := kubeletProcEndpoints(procRoot, pid)
		if err != nil {
			others = append(others, fmt.Sprintf("pid %d: %v", pid, err))
			continue
		}
		if endpointPath(ep.runtime) != sock {
			others = append(others, fmt.Sprintf("pid %d uses %s (%s)", pid, ep.runtime, ep.runtimeFrom))
			continue
		}
		if endpointPath(ep.image) != sock {
			return finding{"kubelet", warn, fmt.Sprintf("pid %d runs through the shim but pulls images from %s (%s)", pid, ep.image, ep.imageFrom),
				"set imageServiceEndpoint to the shim's socket too (deploy/kubelet/50-cri-shim.conf does)"}
		}
		return finding{"kubelet", ok, fmt.Sprintf("pid %d uses the shim's socket (%s)", pid, ep.runtimeFrom), ""}
	}
	return finding{"kubelet", fail, "the running kubelet does not use the shim's socket unix://" + sock + ": " + strings.Join(others, "; "),
		"deploy/install.sh --with-kubelet (then the kubelet is restarted); flags on its command line win over configuration files"}
}

// endpointPath is an endpoint's socket path: unix:// and /var/run's
// symlink taken off, cleaned.
func endpointPath(ep string) string {
	p := filepath.Clean(strings.TrimPrefix(ep, "unix://"))
	if rest, found := strings.CutPrefix(p, "/var/run/"); found {
		p = "/run/" + rest
	}
	return p
}

// kubeletPIDs lists the processes whose command name is kubelet.
func kubeletPIDs(procRoot string) []int {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == "kubelet" {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// kubeletProcEndpoints reads a running kubelet's endpoints: its command line,
// then its files as the process sees them (through /proc/PID/root, relative
// paths from its working directory).
func kubeletProcEndpoints(procRoot string, pid int) (kubeletEndpoints, error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	b, err := readLimited(filepath.Join(dir, "cmdline"))
	if err != nil {
		return kubeletEndpoints{}, err
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) > 0 {
		args = args[1:]
	}
	cwd, _ := os.Readlink(filepath.Join(dir, "cwd"))
	open := func(p string) string {
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		return filepath.Join(dir, "root", p)
	}
	return kubeletArgsEndpoints(args, open)
}

// kubeletFlag is the last value of a kubelet flag (pflag: the last one given
// wins), given as --name=value or --name value.
func kubeletFlag(args []string, name string) (string, bool) {
	val, found := "", false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			val, found = v, true
		} else if a == "--"+name && i+1 < len(args) {
			val, found = args[i+1], true
			i++
		}
	}
	return val, found
}

// kubeletArgsEndpoints resolves the endpoints from a kubelet command line:
// a flag wins; else the --config file, then the --config-dir drop-ins
// (*.conf, walked in lexical order, each a JSON merge patch: the kubelet's
// mergeKubeletConfigurations in cmd/kubelet/app/server.go); else the
// kubelet's default. The image endpoint defaults to the runtime endpoint
// (pkg/kubelet/kubelet.go, PreInitRuntimeService). open maps a path the
// kubelet names to where doctor reads it.
func kubeletArgsEndpoints(args []string, open func(string) string) (kubeletEndpoints, error) {
	var ep kubeletEndpoints
	ep.runtime, ep.runtimeFrom = kubeletDefaultEndpoint, "the kubelet's default"
	var files []string
	if f, ok := kubeletFlag(args, "config"); ok && f != "" {
		files = append(files, f)
	}
	if d, ok := kubeletFlag(args, "config-dir"); ok && d != "" {
		drop, err := kubeletDropIns(open(d))
		if err != nil {
			return ep, err
		}
		for _, p := range drop {
			rel, _ := filepath.Rel(open(d), p)
			files = append(files, filepath.Join(d, rel))
		}
	}
	for _, f := range files {
		m, err := kubeletConfigFile(open(f))
		if err != nil {
			return ep, fmt.Errorf("%s: %w", f, err)
		}
		if v, present := m["containerRuntimeEndpoint"]; present {
			ep.runtime, ep.runtimeFrom = stringOr(v, kubeletDefaultEndpoint), f
		}
		if v, present := m["imageServiceEndpoint"]; present {
			ep.image, ep.imageFrom = stringOr(v, ""), f
		}
	}
	if v, ok := kubeletFlag(args, "container-runtime-endpoint"); ok {
		ep.runtime, ep.runtimeFrom = v, "--container-runtime-endpoint on its command line"
	}
	if v, ok := kubeletFlag(args, "image-service-endpoint"); ok {
		ep.image, ep.imageFrom = v, "--image-service-endpoint on its command line"
	}
	if ep.image == "" {
		ep.image, ep.imageFrom = ep.runtime, ep.runtimeFrom
	}
	return ep, nil
}

// stringOr: a merge patch's null (or a non-string) leaves the default.
func stringOr(v any, def string) string {
	if s, ok := v.(string); ok && s != "" {
		return s
	}
	return def
}

// kubeletDropIns lists the *.conf files under dir, subdirectories included,
// in the order filepath.WalkDir visits them (lexical), as the kubelet does.
// A missing directory has none.
func kubeletDropIns(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == dir {
				return fs.SkipAll
			}
			return err
		}
		if !d.IsDir() && filepath.Ext(d.Name()) == ".conf" {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// kubeletConfigFile reads a kubelet configuration file (YAML or JSON) into
// its top-level keys.
func kubeletConfigFile(path string) (map[string]any, error) {
	b, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("not a kubelet configuration: %w", err)
	}
	return m, nil
}

// readLimited reads at most kubeletFileMax bytes of a file it expects to be
// small, and says when it is larger.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, kubeletFileMax+1))
	if err != nil {
		return nil, err
	}
	if len(b) > kubeletFileMax {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, kubeletFileMax)
	}
	return b, nil
}
