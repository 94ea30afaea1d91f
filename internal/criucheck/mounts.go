package criucheck

import (
	"os"
	"path"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// restrictive are the mount flags a mount must keep where the spec sets them.
var restrictive = []struct {
	flag uint32
	opt  string
}{
	{unix.MS_RDONLY, "ro"},
	{unix.MS_NOSUID, "nosuid"},
	{unix.MS_NODEV, "nodev"},
	{unix.MS_NOEXEC, "noexec"},
}

// freshTypes are the file systems CRIU mounts anew, by the spec's type name:
// kernel views a container has, none of them backed by a host device.
var freshTypes = map[mnt.Fstype]string{
	mnt.Fstype_PROC:    "proc",
	mnt.Fstype_SYSFS:   "sysfs",
	mnt.Fstype_TMPFS:   "tmpfs",
	mnt.Fstype_DEVPTS:  "devpts",
	mnt.Fstype_MQUEUE:  "mqueue",
	mnt.Fstype_CGROUP:  "cgroup",
	mnt.Fstype_CGROUP2: "cgroup2",
}

// checkMounts compares the mount tree the restore rebuilds
// (mountpoints-*.img; criu/mount.c, populate_mnt_ns: CRIU mounts exactly
// what the image lists, and runc's restore re-applies no mask) with the
// mounts runc makes for the spec: every mount is the root, a bind mount
// runc hands to CRIU as external (the spec's mounts and masked files), or
// a fresh kernel file system where the spec mounts that type, rooted where
// runc roots it; none is less restricted than the spec's; and every mount
// of the spec, read-only and masked paths included, is there.
func (c *checker) checkMounts() error {
	seen := map[string]bool{}
	for _, name := range c.files["mounts"] {
		err := eachEntry(c.dir, name, "MNTS", func() *mnt.MntEntry { return new(mnt.MntEntry) }, func(m *mnt.MntEntry) error {
			seen[mountpointOf(m)] = true
			return c.checkMount(name, m)
		})
		if err != nil {
			return asRefusal(name, err)
		}
	}
	if len(c.files["mounts"]) == 0 {
		return nil // the mount namespace is not the restore's (checkRootNamespaces)
	}
	image := c.files["mounts"][0]
	for _, m := range c.p.spec.Mounts {
		if d := path.Clean("/" + m.Destination); !seen[d] {
			return refuse(image, "mountpoint "+d, "missing: the container's spec mounts %s there", m.Type)
		}
	}
	for _, masked := range []bool{false, true} {
		for _, p := range linuxPaths(c.p.spec, masked) {
			if !seen[p] && c.onNode(p) {
				return refuse(image, "mountpoint "+p, "missing: the container's spec makes it read-only or masks it")
			}
		}
	}
	return nil
}

// onNode reports whether runc would find path p of the container to make
// read-only or mask (it skips those that do not exist: libcontainer/
// rootfs_linux.go, readonlyPath, maskPaths): a path on the spec's proc or
// sysfs mount is looked up in the node's, the same kernel's; another is
// taken to exist.
func (c *checker) onNode(p string) bool {
	for _, m := range c.p.spec.Mounts {
		d := path.Clean("/" + m.Destination)
		var host string
		switch m.Type {
		case "proc":
			host = "/proc"
		case "sysfs":
			host = "/sys"
		default:
			continue
		}
		if rest, ok := strings.CutPrefix(p, d+"/"); ok {
			_, err := os.Lstat(host + "/" + rest)
			return err == nil
		}
	}
	return true
}

func mountpointOf(m *mnt.MntEntry) string {
	p := strings.TrimPrefix(m.GetMountpoint(), ".")
	if p == "" {
		return "/"
	}
	return path.Clean(p)
}

func (c *checker) checkMount(image string, m *mnt.MntEntry) error {
	mp := mountpointOf(m)
	field := "mountpoint " + mp
	if why := checkPath(m.GetMountpoint()); why != "" {
		return refuse(image, field, "%s", why)
	}
	if why := checkPath(m.GetRoot()); why != "" {
		return refuse(image, field+" root", "%q %s", m.GetRoot(), why)
	}
	if m.GetDeleted() || m.GetWithPlugin() || m.GetInternalSharing() || m.GetFsname() != "" {
		return refuse(image, field, "a deleted, plugin-restored, internally shared or named-file-system mount: the restore would create or mount it as root")
	}
	spec := c.p.spec
	if m.GetSharedId() != 0 && !c.propagates(mp, "shared") {
		return refuse(image, field+" shared_id", "%d: a peer group the container's mount is not in", m.GetSharedId())
	}
	if m.GetMasterId() != 0 && !c.propagates(mp, "slave") && !c.propagates(mp, "shared") {
		return refuse(image, field+" master_id", "%d: a slave of a peer group the container's mount is not in", m.GetMasterId())
	}
	if mp == "/" {
		if spec.Root != nil && spec.Root.Readonly && m.GetFlags()&unix.MS_RDONLY == 0 {
			return refuse(image, field+" flags", "read-write, and the container's root is read-only")
		}
		return nil
	}
	sm := specMount(spec, mp)
	if m.GetExtKey() != "" || m.GetExtMount() {
		// runc names each bind mount of the spec and each masked path
		// to CRIU as an external mount (libcontainer/criu_linux.go,
		// addCriuRestoreMount, addMaskPaths); another key is a mount of
		// the host the restore would look up.
		key := m.GetExtKey()
		switch {
		case sm != nil && key == mp:
		case key == "/dev/null" && slices.Contains(linuxPaths(spec, true), mp):
		case c.isDevice(mp) && key == mp:
		case key == mp && under(mp, specMountsOfType(spec, "cgroup")):
			// cgroup v1 without a cgroup namespace: runc binds each
			// controller's directory below the spec's cgroup mount.
		default:
			return refuse(image, field, "an external mount (key %q) where the container has none of that source", key)
		}
		return checkFlags(image, field, m, sm, spec, mp)
	}
	typ, ok := freshTypes[mnt.Fstype(m.GetFstype())]
	if !ok {
		return refuse(image, field+" fstype", "%v: the restore would mount a file system a container is not given", mnt.Fstype(m.GetFstype()))
	}
	root := path.Clean("/" + m.GetRoot())
	wantRoot := "/"
	switch {
	case typ == "cgroup2" && sm != nil && sm.Type == "cgroup":
		// cgroup v2: runc mounts the unified hierarchy where the spec
		// mounts cgroups (libcontainer/rootfs_linux.go, mountCgroupV2),
		// rooted at the container's cgroup; the kernel shows that root
		// relative to the reader's cgroup namespace (kernel/cgroup,
		// cgroup_show_path), so "/" where the container's namespace is
		// rooted at its cgroup.
		if !c.cgroupTops[root] && (root != "/" || !c.specHasNS(specs.CgroupNamespace)) {
			return refuse(image, field+" root", "%q is not the container's cgroup", m.GetRoot())
		}
		wantRoot = root
	case typ == "cgroup" && under(mp, specMountsOfType(spec, "cgroup")):
		// cgroup v1: one mount per controller below the spec's cgroup
		// mount, of the container's own cgroup (cgroup.img's directory),
		// with that mount's flags.
		if !c.cgroupTops[root] {
			return refuse(image, field+" root", "%q is not the container's cgroup", m.GetRoot())
		}
		return checkFlags(image, field, m, specMount(spec, parentOf(mp, specMountsOfType(spec, "cgroup"))), spec, mp)
	case typ == "cgroup" || typ == "cgroup2":
		return refuse(image, field+" fstype", "%s where runc mounts no such hierarchy", typ)
	case sm != nil && sm.Type == typ:
	case typ == "tmpfs" && sm != nil && sm.Type == "cgroup":
		// cgroup v1: the tmpfs holding the controllers' mounts, which runc
		// mounts with its default flags, not the spec's read-only
		// (libcontainer/rootfs_linux.go, mountCgroupV1); the controllers'
		// mounts below keep it.
		if root != "/" {
			return refuse(image, field+" root", "%q; runc mounts it anew", m.GetRoot())
		}
		return checkFlags(image, field, m, &specs.Mount{Options: []string{"nosuid", "nodev", "noexec"}}, spec, mp)
	case slices.Contains(linuxPaths(spec, false), mp):
		// runc's read-only paths: a bind of the path onto itself, which
		// CRIU rebuilds from the file system the path is on
		// (libcontainer/rootfs_linux.go, readonlyPath).
		on := parentOf(mp, specMountsOfType(spec, typ))
		if on == "" {
			return refuse(image, field+" fstype", "%s, and the container's %s is on no %s mount", typ, mp, typ)
		}
		wantRoot = strings.TrimPrefix(mp, on)
		if m.GetFlags()&unix.MS_RDONLY == 0 {
			return refuse(image, field+" flags", "read-write, and the container's spec makes it read-only")
		}
	case slices.Contains(linuxPaths(spec, true), mp):
		// runc's masked directories: an empty read-only tmpfs
		// (libcontainer/rootfs_linux.go, maskPath).
		if typ != "tmpfs" || m.GetFlags()&unix.MS_RDONLY == 0 {
			return refuse(image, field+" flags", "a read-write or non-tmpfs mount where the container's spec masks the path")
		}
	default:
		return refuse(image, field+" fstype", "%s where the container's spec mounts no %s", typ, typ)
	}
	if root != wantRoot {
		return refuse(image, field+" root", "%q; runc mounts it at %q", m.GetRoot(), wantRoot)
	}
	return checkFlags(image, field, m, sm, spec, mp)
}

// checkFlags refuses a mount that drops a restriction the spec's mount has.
func checkFlags(image, field string, m *mnt.MntEntry, sm *specs.Mount, spec *specs.Spec, mp string) error {
	if sm == nil {
		return nil
	}
	for _, r := range restrictive {
		if slices.Contains(sm.Options, r.opt) && m.GetFlags()&r.flag == 0 {
			return refuse(image, field+" flags", "without %s, which the container's mount has", r.opt)
		}
	}
	return nil
}

// propagates reports whether the spec's mount at mp (the root: the spec's
// rootfs propagation) is of that kind (shared: shared or rshared; slave:
// slave or rslave).
func (c *checker) propagates(mp, kind string) bool {
	spec := c.p.spec
	if mp == "/" {
		return spec.Linux != nil && strings.HasSuffix(spec.Linux.RootfsPropagation, kind)
	}
	if sm := specMount(spec, mp); sm != nil {
		return slices.Contains(sm.Options, kind) || slices.Contains(sm.Options, "r"+kind)
	}
	return false
}

// isDevice: runc bind-mounts the spec's devices as external mounts.
func (c *checker) isDevice(p string) bool {
	if c.p.spec.Linux == nil {
		return false
	}
	for _, d := range c.p.spec.Linux.Devices {
		if path.Clean(d.Path) == p {
			return true
		}
	}
	return false
}

func specMount(spec *specs.Spec, dest string) *specs.Mount {
	var found *specs.Mount
	for i := range spec.Mounts {
		if path.Clean(spec.Mounts[i].Destination) == dest {
			found = &spec.Mounts[i] // the last one mounted there is visible
		}
	}
	return found
}

func specMountsOfType(spec *specs.Spec, typ string) []string {
	var out []string
	for _, m := range spec.Mounts {
		if m.Type == typ {
			out = append(out, path.Clean(m.Destination))
		}
	}
	return out
}

// linuxPaths are the spec's masked (masked true) or read-only paths.
func linuxPaths(spec *specs.Spec, masked bool) []string {
	if spec.Linux == nil {
		return nil
	}
	ps := spec.Linux.ReadonlyPaths
	if masked {
		ps = spec.Linux.MaskedPaths
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = path.Clean(p)
	}
	return out
}

// parentOf is the one of dirs p is below, or "".
func parentOf(p string, dirs []string) string {
	for _, d := range dirs {
		if strings.HasPrefix(p, d+"/") {
			return d
		}
	}
	return ""
}

func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
