package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/layout"
)

var criuVersionRE = regexp.MustCompile(`Version:\s*(\d+)\.(\d+)`)

// criuDumpTimeout bounds the doctor's trial dump: a working CRIU dumps a
// sleeping process in well under a second.
const criuDumpTimeout = 20 * time.Second

// checkCRIU finds the criu runc will run (the first on PATH) and asks it for
// its version and `criu check`; as root it then dumps a process of its own
// (checkCRIUDumps), because a CRIU can pass `criu check` and still hang in
// every dump: Debian trixie's 4.1.1 does on kernel 6.18.44 (the parasite's
// cure waits for good, "Waiting for N to trap"), which a checkpoint only
// reports as its deadline passing.
func checkCRIU() finding {
	bin, err := exec.LookPath("criu")
	if err != nil {
		return finding{"criu", warn, "not on PATH: CheckpointPod, RestorePod and warm starts fail; everything else works",
			"install CRIU 4 (runc runs the first criu on its PATH)"}
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return finding{"criu", warn, fmt.Sprintf("%s --version: %v", bin, err), "reinstall CRIU 4"}
	}
	f := criuVersionFinding(bin, string(out))
	if f.level != ok || os.Geteuid() != 0 {
		return f
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "check").CombinedOutput(); err != nil {
		return finding{"criu", warn, fmt.Sprintf("%s: criu check failed: %s", f.detail, lastLine(string(out))),
			"see `criu check` (a CRIU too old for this kernel fails here: Debian bookworm's 3.17 does on 6.x)"}
	}
	f.detail += "; criu check: looks good"
	if err := checkCRIUDumps(bin, criuDumpTimeout); err != nil {
		return finding{"criu", warn, fmt.Sprintf("%s, but %v: checkpoints fail with \"deadline reached\"", f.detail, err),
			"install a CRIU that dumps on this kernel (Debian trixie's 4.1.1 hangs on 6.18.44, sid's 4.2.1 dumps)"}
	}
	f.detail += "; a trial dump: done"
	return f
}

// checkCRIUDumps dumps a sleeping child of the doctor's, left running, into
// a private temporary directory removed afterwards, within timeout.
func checkCRIUDumps(bin string, timeout time.Duration) error {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return nil // nothing to dump: the check is skipped, not failed
	}
	dir, err := os.MkdirTemp("", "cri-shim-doctor-criu-")
	if err != nil {
		return fmt.Errorf("a trial dump could not be made: %w", err)
	}
	defer os.RemoveAll(dir)
	child := exec.Command(sleep, "600")
	// Its own session: CRIU dumps a tree whose session leader is inside it.
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		return fmt.Errorf("a trial dump could not be made: %w", err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	log := filepath.Join(dir, "dump.log")
	err = exec.CommandContext(ctx, bin, "dump", "-t", strconv.Itoa(child.Process.Pid), "-D", dir,
		"--leave-running", "-o", log).Run()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("a trial dump of a sleeping process did not end within %s", timeout)
	case err != nil:
		b, _ := os.ReadFile(log)
		return fmt.Errorf("a trial dump of a sleeping process failed: %s", lastLine(string(b)))
	}
	return nil
}

func criuVersionFinding(bin, out string) finding {
	m := criuVersionRE.FindStringSubmatch(out)
	if m == nil {
		return finding{"criu", warn, fmt.Sprintf("%s: no version in %q", bin, lastLine(out)), "install CRIU 4"}
	}
	major, _ := strconv.Atoi(m[1])
	v := m[1] + "." + m[2]
	if major < 4 {
		return finding{"criu", warn, fmt.Sprintf("%s is CRIU %s: older than 4, which checkpoints fail with on recent kernels", bin, v), "install CRIU 4"}
	}
	return finding{"criu", ok, fmt.Sprintf("%s is CRIU %s", bin, v), ""}
}

// checkRunc asks the runc on PATH (the runc shim's default binary) for its
// version: on a cgroup v2 node a runc older than 1.2 would restore into the
// cgroup a checkpoint's images name, so the runtime shim refuses restores
// there (criucheck.RuncRestoresCgroupV2).
func checkRunc(mode string) finding {
	bin, err := exec.LookPath("runc")
	if err != nil {
		return finding{"runc", warn, "not on PATH: the runc shim runs the runtime's configured BinaryName", ""}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return finding{"runc", warn, fmt.Sprintf("%s --version: %v", bin, err), "reinstall runc"}
	}
	return runcFinding(bin, string(out), mode)
}

func runcFinding(bin, out, mode string) finding {
	ver := strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
	if mode != layout.CgroupV2 {
		return finding{"runc", ok, bin + ": " + ver, ""}
	}
	if err := criucheck.RuncRestoresCgroupV2(out); err != nil {
		return finding{"runc", warn, fmt.Sprintf("%s: %v: RestorePod and warm starts are refused on this cgroup v2 node", bin, err),
			"install runc 1.2 or later (Debian bookworm's is 1.1.5)"}
	}
	return finding{"runc", ok, bin + ": " + ver + " (restores into the new container's cgroup on cgroup v2)", ""}
}
