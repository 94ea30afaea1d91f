package criucheck

import (
	"fmt"
	"regexp"
	"strconv"
)

var runcVersionRE = regexp.MustCompile(`(?m)^runc version (\d+)\.(\d+)`)

// RuncRestoresCgroupV2 says whether the runc whose `runc --version` printed
// out restores into the new container's cgroup on a cgroup v2 node: runc
// older than 1.2 gives CRIU no cgroup root for the unified hierarchy, so
// CRIU moves the restored tasks into the cgroup the image names (and
// creates it), outside the new container's limits (shared/NODE-STACK.md;
// runc libcontainer/criu_linux.go, criuApplyCgroups). A version that cannot
// be read is refused.
func RuncRestoresCgroupV2(out string) error {
	m := runcVersionRE.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("runc's version could not be read from %q", truncate(out, 80))
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < 1 || major == 1 && minor < 2 {
		return fmt.Errorf("runc %s.%s restores a checkpoint into the cgroup its images name on a cgroup v2 node, not the new container's; restores need runc 1.2 or later", m[1], m[2])
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
