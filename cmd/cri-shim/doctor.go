package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// A finding is one preflight check's verdict.
type finding struct {
	name   string
	level  level
	detail string
	fix    string
}

type level int

const (
	ok level = iota
	warn
	fail
)

func (l level) String() string { return [...]string{" OK ", "WARN", "FAIL"}[l] }

func newDoctorCmd() *cobra.Command {
	var (
		path, format string
		only         []string
		env          = doctorEnv{proc: "/proc", root: "/"}
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the node for what the shim needs and say what to fix",
		Long: `Check the node for what the shim needs: the configuration, kernel and cgroup
version, CRIU, containerd, the shim's socket and directories, and whether the
running kubelet uses the shim; each finding says what to fix. Exits 1 when a
check fails (the shim cannot work), 0 with warnings (a feature is limited).`,
	}
	configFlag(cmd.Flags(), &path, config.DefaultPath, defaultConfigUsage)
	outputFlag(cmd, &format)
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these checks: "+strings.Join(doctorChecks, ", "))
	// Where the kubelet check looks (tests point them at a fake node).
	cmd.Flags().StringVar(&env.proc, "proc", env.proc, "the proc file system")
	cmd.Flags().StringVar(&env.root, "host-root", env.root, "the node's root, for its kubelet files when no kubelet runs")
	_ = cmd.Flags().MarkHidden("proc")
	_ = cmd.Flags().MarkHidden("host-root")
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(format); err != nil {
			return err
		}
		for _, o := range only {
			if !slices.Contains(doctorChecks, o) {
				return usageErrorf("unknown check %q in --only (want %s)", o, strings.Join(doctorChecks, ", "))
			}
		}
		cfg, err := loadConfig(cmd, path, false)
		if err != nil {
			return err
		}
		env.only = only
		fs := doctor(cfg, path, env)
		if err := printOutput(cmd.OutOrStdout(), format, findingsJSON(fs), func(w io.Writer) { report(w, fs) }); err != nil {
			return err
		}
		if worst(fs) == fail {
			return exitError{1, nil} // reported
		}
		return nil
	})
	return cmd
}

// doctorEnv is where doctor looks, and which checks it runs (all when only is empty).
type doctorEnv struct {
	proc, root string
	only       []string
}

// doctorChecks names the checks --only selects.
var doctorChecks = []string{"config", "kernel", "cgroup", "criu", "runc", "containerd", "socket", "dirs", "kubelet"}

func (e doctorEnv) runs(check string) bool { return len(e.only) == 0 || slices.Contains(e.only, check) }

// doctor checks what the shim needs of the node and says what to fix:
// the configuration, kernel and cgroup version, CRIU, containerd, the shim's
// socket and directories, and whether the running kubelet uses the shim.
func doctor(cfg config.Config, path string, env doctorEnv) []finding {
	var fs []finding
	if env.runs("config") {
		if err := cfg.Validate(); err != nil {
			fs = append(fs, finding{"config", fail, err.Error(), "correct " + path + " (cri-shim config check --config " + path + ")"})
		} else {
			fs = append(fs, finding{"config", ok, path + " is valid", ""})
		}
	}
	if env.runs("kernel") {
		fs = append(fs, checkKernel())
	}
	if env.runs("cgroup") {
		fs = append(fs, checkCgroup("/sys/fs/cgroup"))
	}
	if env.runs("criu") {
		fs = append(fs, checkCRIU())
	}
	if env.runs("runc") {
		fs = append(fs, checkRunc(layout.NodeCgroupMode()))
	}
	if env.runs("containerd") {
		fs = append(fs, checkRuntime(cfg.Runtime.Endpoint)...)
	}
	if env.runs("socket") {
		fs = append(fs, checkSocket(cfg.Server.Listen, cfg.SocketModeBits()))
	}
	if env.runs("dirs") {
		fs = append(fs, checkDir("state_dir", cfg.StateDir), checkDir("checkpoint.root", cfg.Checkpoint.Root))
	}
	if env.runs("kubelet") {
		fs = append(fs, checkKubelet(env.proc, env.root, cfg.Server.Listen))
	}
	return fs
}

// findingJSON is a finding in doctor -o json/yaml.
type findingJSON struct {
	Check  string `json:"check"`
	Level  string `json:"level"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func findingsJSON(fs []finding) []findingJSON {
	out := make([]findingJSON, 0, len(fs))
	for _, f := range fs {
		out = append(out, findingJSON{f.name, [...]string{"ok", "warn", "fail"}[f.level], f.detail, f.fix})
	}
	return out
}

func worst(fs []finding) level {
	w := ok
	for _, f := range fs {
		w = max(w, f.level)
	}
	return w
}

// report prints the findings and returns the exit code.
func report(w io.Writer, fs []finding) int {
	for _, f := range fs {
		fmt.Fprintf(w, "[%s] %-16s %s\n", f.level, f.name, f.detail)
		if f.fix != "" && f.level != ok {
			fmt.Fprintf(w, "       %-16s fix: %s\n", "", f.fix)
		}
	}
	if worst(fs) == fail {
		return 1
	}
	return 0
}

func checkKernel() finding {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return finding{"kernel", warn, err.Error(), ""}
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	fmt.Sscanf(rel, "%d.%d", &major, &minor)
	if major < 5 || major == 5 && minor < 4 {
		return finding{"kernel", warn, rel + ": older than 5.4; CRIU 4 and the cgroup freezer need a recent kernel for checkpoints", "use a 5.4 or newer kernel"}
	}
	return finding{"kernel", ok, rel, ""}
}

// checkCgroup tells cgroup v2 (unified) from v1 by the file system type at dir.
func checkCgroup(dir string) finding {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return finding{"cgroup", warn, fmt.Sprintf("%s: %v", dir, err), ""}
	}
	return cgroupFinding(int64(st.Type))
}

func cgroupFinding(fsType int64) finding {
	if fsType == unix.CGROUP2_SUPER_MAGIC {
		return finding{"cgroup", ok, "v2 (unified)", ""}
	}
	return finding{"cgroup", warn, "v1: deprecated; kubelet v1.36 refuses it unless failCgroupV1: false (and cgroupDriver: cgroupfs without systemd's unified hierarchy)",
		"boot with systemd.unified_cgroup_hierarchy=1, or set failCgroupV1: false in the kubelet's configuration"}
}

// checkRuntime asks the runtime behind endpoint for its version and status.
func checkRuntime(endpoint string) []finding {
	rt, closeConn, err := dialCRI(endpoint)
	if err != nil {
		return []finding{{"containerd", fail, err.Error(), "check runtime.endpoint in the config"}}
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return []finding{{"containerd", fail, fmt.Sprintf("%s does not answer: %v", endpoint, err),
			"start containerd (systemctl start containerd) or correct runtime.endpoint"}}
	}
	fs := []finding{runtimeVersionFinding(v.GetRuntimeName(), v.GetRuntimeVersion())}
	st, err := rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return append(fs, finding{"runtime status", warn, err.Error(), ""})
	}
	return append(fs, runtimeStatusFinding(st.GetStatus().GetConditions()), restoreRouteFinding(st.GetInfo()["config"], executable))
}

// executable reports whether p is a regular file with an execute bit.
func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// restoreRouteFinding checks that the pods' default handler runs cri-shim's
// runtime shim, which every restore needs (docs/restore-route.md), from
// containerd's CRI configuration; a runtime_path naming a missing binary
// fails every pod of the handler.
func restoreRouteFinding(configJSON string, exists func(string) bool) finding {
	const name = "restore route"
	fix := "deploy/install.sh --with-containerd (installs " + restoremark.RuntimeShimName +
		" and /etc/containerd/conf.d/50-cri-shim.toml), then systemctl restart containerd"
	hs, err := restoremark.Handlers(configJSON)
	if err != nil || len(hs) == 0 {
		return finding{name, warn, "cannot read containerd's handlers from its verbose status", ""}
	}
	var without []string
	for _, h := range hs {
		if h.RuntimePath != "" && !exists(h.RuntimePath) {
			return finding{name, fail, fmt.Sprintf("handler %q runs %s, which is not an executable file: no pod of it can start", h.Handler, h.RuntimePath),
				"install it (deploy/install.sh) or remove the handler's runtime_path"}
		}
		if !h.Restores {
			without = append(without, h.Handler)
		}
	}
	def := hs[0]
	if !def.Restores {
		return finding{name, warn, fmt.Sprintf("the default handler %q runs containerd's own shim: RestorePod, warm starts and warm restarts fail (the rest works)", def.Handler), fix}
	}
	detail := fmt.Sprintf("handler %q runs %s: restores work", def.Handler, def.RuntimePath)
	if len(without) > 0 {
		slices.Sort(without)
		detail += "; not on handler(s) " + strings.Join(without, ", ")
	}
	return finding{name, ok, detail, ""}
}

// runtimeStatusFinding: RuntimeReady and NetworkReady must hold (the kubelet
// needs both); other conditions (containerd's deprecation notices) are shown.
func runtimeStatusFinding(conds []*runtimeapi.RuntimeCondition) finding {
	var notReady, notes []string
	seen := map[string]bool{}
	for _, c := range conds {
		seen[c.GetType()] = true
		if c.GetStatus() {
			continue
		}
		s := fmt.Sprintf("%s (%s: %s)", c.GetType(), c.GetReason(), c.GetMessage())
		if c.GetType() == runtimeapi.RuntimeReady || c.GetType() == runtimeapi.NetworkReady {
			notReady = append(notReady, s)
		} else {
			notes = append(notes, s)
		}
	}
	for _, want := range []string{runtimeapi.RuntimeReady, runtimeapi.NetworkReady} {
		if !seen[want] {
			notReady = append(notReady, want+" not reported")
		}
	}
	if len(notReady) > 0 {
		return finding{"runtime status", warn, "not ready: " + strings.Join(notReady, "; "), "see containerd's log (a missing CNI configuration shows here)"}
	}
	detail := "RuntimeReady, NetworkReady"
	if len(notes) > 0 {
		detail += "; also: " + strings.Join(notes, "; ")
	}
	return finding{"runtime status", ok, detail, ""}
}

func runtimeVersionFinding(name, version string) finding {
	what := name + " " + version
	if name != "containerd" {
		return finding{"containerd", warn, what + ": cri-shim is built and tested on containerd 2", "run containerd 2"}
	}
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(version, "v"), ".", 2)[0])
	if major < 2 {
		return finding{"containerd", fail, what + ": containerd 2 is needed (task API and CRI restore the shim uses)", "upgrade containerd to 2.x"}
	}
	return finding{"containerd", ok, what, ""}
}

func dialCRI(endpoint string) (runtimeapi.RuntimeServiceClient, func(), error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(cc), func() { cc.Close() }, nil
}

// checkSocket checks the shim's own socket: present, a socket, root's, with
// the configured mode, and answering.
func checkSocket(listen string, mode os.FileMode) finding {
	path := strings.TrimPrefix(listen, "unix://")
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return finding{"shim socket", warn, path + " does not exist: the shim is not running", "systemctl enable --now cri-shim"}
	}
	if err != nil {
		return finding{"shim socket", fail, err.Error(), ""}
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return finding{"shim socket", fail, path + " is not a socket", "remove it and restart the shim"}
	}
	if got := fi.Mode().Perm(); got != mode {
		return finding{"shim socket", fail, fmt.Sprintf("%s has mode %04o, the config says %04o", path, got, mode), "restart the shim; make sure nothing else chmods the socket"}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
		return finding{"shim socket", fail, fmt.Sprintf("%s is owned by uid %d, not root", path, st.Uid), "the shim must run as root"}
	}
	rt, closeConn, err := dialCRI(path)
	if err != nil {
		return finding{"shim socket", fail, err.Error(), ""}
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		return finding{"shim socket", fail, fmt.Sprintf("%s does not answer Version: %v", path, err), "journalctl -u cri-shim"}
	}
	return finding{"shim socket", ok, fmt.Sprintf("%s (mode %04o) answers", path, mode), ""}
}

// checkDir checks a directory the shim keeps private data in: if it exists,
// root's and not writable (or, for checkpoints, readable) by others.
func checkDir(name, dir string) finding {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return finding{name, ok, dir + " (created 0700 at start)", ""}
	}
	if err != nil {
		return finding{name, fail, err.Error(), ""}
	}
	if !fi.IsDir() {
		return finding{name, fail, dir + " is not a directory", "point " + name + " at a directory"}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
		return finding{name, fail, fmt.Sprintf("%s is owned by uid %d, not root", dir, st.Uid), "chown root:root " + dir}
	}
	if p := fi.Mode().Perm(); p&0o077 != 0 {
		return finding{name, warn, fmt.Sprintf("%s has mode %04o: others can read pods' memory images and tokens there", dir, p), "chmod 0700 " + dir}
	}
	return finding{name, ok, dir, ""}
}

var endpointFlagRE = regexp.MustCompile(`--(container-runtime|image-service)-endpoint[= ](\S+)`)

// checkKubeletFiles looks, under root, at where a kubeadm node's kubelet
// takes its runtime endpoint from: flags files (which win) and
// configuration files, drop-ins included, and says whether they name the
// shim's socket. For when no kubelet runs (checkKubelet reads a running one).
func checkKubeletFiles(root, listen string) finding {
	sock := "unix://" + strings.TrimPrefix(listen, "unix://")
	for _, f := range []string{"var/lib/kubelet/kubeadm-flags.env", "etc/default/kubelet", "etc/sysconfig/kubelet"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
		}
		for _, m := range endpointFlagRE.FindAllStringSubmatch(string(b), -1) {
			if v := strings.Trim(m[2], `"'`); v != sock {
				return finding{"kubelet", warn, fmt.Sprintf("/%s passes --%s-endpoint=%s; flags win over configuration files", f, m[1], v),
					"remove the flag from /" + f + " and use deploy/kubelet/50-cri-shim.conf"}
			}
		}
	}
	files := []string{filepath.Join(root, "var/lib/kubelet/config.yaml")}
	drop, _ := kubeletDropIns(filepath.Join(root, "etc/kubernetes/kubelet.conf.d"))
	files = append(files, drop...) // drop-ins are read after the main file, in name order
	endpoint, from := "", ""
	for _, f := range files {
		m, err := kubeletConfigFile(f)
		if err != nil {
			continue
		}
		if v, present := m["containerRuntimeEndpoint"]; present {
			endpoint, from = stringOr(v, ""), f
		}
	}
	switch {
	case endpoint == "":
		return finding{"kubelet", warn, "no kubelet configuration here names a runtime endpoint", "install deploy/kubelet/50-cri-shim.conf (deploy/install.sh --with-kubelet)"}
	case endpoint != sock:
		return finding{"kubelet", warn, fmt.Sprintf("%s sets containerRuntimeEndpoint %s, not the shim's %s", from, endpoint, sock),
			"install deploy/kubelet/50-cri-shim.conf (deploy/install.sh --with-kubelet) and restart the kubelet"}
	}
	return finding{"kubelet", ok, "containerRuntimeEndpoint is the shim's socket (" + from + ")", ""}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
