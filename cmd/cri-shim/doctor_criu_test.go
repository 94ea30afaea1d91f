package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// fakeCRIU writes a criu stand-in running script, with "$log" set to the
// path after -o.
func fakeCRIU(t *testing.T, script string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "criu")
	body := "#!/bin/sh\nlog=\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && log=$2; shift; done\n" + script + "\n"
	if err := os.WriteFile(bin, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestCheckCRIUDumps(t *testing.T) {
	if err := checkCRIUDumps(fakeCRIU(t, "exit 0"), 5*time.Second); err != nil {
		t.Errorf("a dump that succeeds: %v", err)
	}
	err := checkCRIUDumps(fakeCRIU(t, `echo "Error (criu/cr-dump.c:1): boom" > "$log"; exit 1`), 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "failed: Error (criu/cr-dump.c:1): boom") {
		t.Errorf("a dump that fails: %v, want its log's last line", err)
	}
	start := time.Now()
	err = checkCRIUDumps(fakeCRIU(t, "exec sleep 30"), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not end within 300ms") {
		t.Errorf("a dump that hangs: %v, want the timeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a hanging dump held the doctor %v", d)
	}
}

func TestRuncFinding(t *testing.T) {
	old := "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\n"
	if f := runcFinding("/usr/sbin/runc", old, layout.CgroupV1); f.level != ok {
		t.Errorf("runc 1.1 on cgroup v1: %+v", f)
	}
	if f := runcFinding("/usr/sbin/runc", old, layout.CgroupV2); f.level != warn || !strings.Contains(f.detail, "refused") {
		t.Errorf("runc 1.1 on cgroup v2: %+v, want a warning that restores are refused", f)
	}
	if f := runcFinding("/usr/sbin/runc", "runc version 1.2.6\n", layout.CgroupV2); f.level != ok {
		t.Errorf("runc 1.2 on cgroup v2: %+v", f)
	}
}
