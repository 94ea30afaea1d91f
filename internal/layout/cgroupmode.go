package layout

import "golang.org/x/sys/unix"

// Cgroup modes a manifest records (Manifest.CgroupMode): CRIU's cgroup
// images of a task on a cgroup v1 node (one hierarchy per controller) and
// on a v2 node (the unified hierarchy, a cgroup namespace) do not describe
// the same tree, so a checkpoint restores only on a node of its mode.
const (
	CgroupV1 = "v1"
	CgroupV2 = "v2"
)

// NodeCgroupMode is this node's cgroup mode: v2 where /sys/fs/cgroup is the
// unified hierarchy, v1 otherwise (a hybrid node's controllers are v1's).
func NodeCgroupMode() string {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return CgroupV2
	}
	return CgroupV1
}
