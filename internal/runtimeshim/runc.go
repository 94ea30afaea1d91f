package runtimeshim

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// nodeCgroupMode is the node's cgroup mode (a variable for tests).
var nodeCgroupMode = layout.NodeCgroupMode

// runcVersions caches `runc --version` by binary: the runtime shim of a
// pod lives as long as the pod, and the binary does not change under it.
var runcVersions sync.Map // binary -> string

// checkRunc refuses a restore of the task in bundle on a cgroup v2 node when
// the runc the runc shim runs for it (the bundle's "runtime" file, which the
// runc shim writes at create: cmd/containerd-shim-runc-v2/runc/container.go,
// WriteRuntime; "runc" on PATH when empty) is older than 1.2
// (criucheck.RuncRestoresCgroupV2).
func checkRunc(ctx context.Context, bundle string) error {
	if nodeCgroupMode() != layout.CgroupV2 {
		return nil
	}
	bin := "runc"
	if b, err := os.ReadFile(filepath.Join(bundle, "runtime")); err == nil && strings.TrimSpace(string(b)) != "" {
		bin = strings.TrimSpace(string(b))
	}
	out, ok := runcVersions.Load(bin)
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		b, err := exec.CommandContext(ctx, bin, "--version").Output()
		if err != nil {
			return fmt.Errorf("%s --version: %w", bin, err)
		}
		out, _ = runcVersions.LoadOrStore(bin, string(b))
	}
	return criucheck.RuncRestoresCgroupV2(out.(string))
}
