package criucheck

import (
	"regexp"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// cgroupV1Controllers are the cgroup v1 hierarchies a container's cgroup.img
// may name (the kernel's subsystems, include/linux/cgroup_subsys.h), and the
// named hierarchy systemd keeps. CRIU mounts each controller entry's names as
// the options of a cgroup mount in its yard and names the yard's directory
// after them (criu/cgroup.c, prepare_cgroup_sfd, ctrl_dir_and_opt): any
// other name would be a mount option ("release_agent=...") or a path
// ("../x") of CRIU's choosing, as root.
var cgroupV1Controllers = map[string]bool{
	"cpu": true, "cpuacct": true, "cpuset": true, "memory": true, "devices": true, "freezer": true,
	"net_cls": true, "net_prio": true, "blkio": true, "perf_event": true, "hugetlb": true, "pids": true,
	"rdma": true, "misc": true, "name=systemd": true,
}

// cgroupFileRE is the name of a cgroup file CRIU dumps: a controller's
// ("memory.limit_in_bytes"), the core's ("cgroup.subtree_control"), or one
// of v1's two without a prefix (criu/cgroup-props.c, global props).
// CRIU writes a property's value to <yard>/<controller>/<dir>/<name> as
// root with no check of the name (criu/cgroup.c, restore_cgroup_prop): the
// name must be one file of the directory.
var cgroupFileRE = regexp.MustCompile(`^([a-z][a-z0-9_]*\.[a-z0-9_.]+|notify_on_release|tasks)$`)

// cgroupDirRE is one directory name below the container's cgroup: CRIU
// dumps a child by its last component (criu/cgroup.c, dump_cg_dirs) and
// creates it with mkdirpat, which would make every directory of a longer
// path.
var cgroupDirRE = regexp.MustCompile(`^[A-Za-z0-9_@:+-][A-Za-z0-9_.@:+-]*$`)

// Bounds of cgroup.img. CRIU builds each directory's and property's path
// in PATH_MAX buffers with unbounded sprintf (prepare_cgroup_dirs), below
// its yard's name: a longer path would overrun them.
const (
	maxCgroupPath     = 3072
	maxCgroupDepth    = 32
	maxCgroupDirs     = 4096
	maxCgroupValue    = 64 << 10
	maxCgroupCnames   = 4
	maxCgroupControls = 32
)

// checkCgroup reads cgroup.img: which cgroups the tasks are moved into and
// which directories the restore creates below the container's, with what
// properties and permissions (criu/cgroup.c, prepare_cgroup_sfd,
// prepare_cgroup_dirs, move_in_cgroup, prepare_cgns). Each field is held to
// what runc's restore of the spec's container gives:
//   - a controller entry names kernel controllers (or systemd's hierarchy),
//     or is the cgroup v2 hierarchy alone, each once;
//   - each has one top directory, the container's own, which runc's
//     cgroup root option rewrites to the new container's (runc's
//     criuApplyCgroups; criu/cgroup.c, rewrite_cgroup_roots); below it,
//     directories are single names, properties files of that directory;
//   - every member of a set names one controller entry exactly, at the top
//     directory or below it;
//   - the cgroup namespace prefix is present exactly when the spec creates
//     a cgroup namespace, and is then the top directory's length, as CRIU
//     dumps a task of the container (CRIU cuts the path at the prefix,
//     unchecked, to find the namespace's root).
func (c *checker) checkCgroup() error {
	const name = "cgroup.img"
	if !c.has("cgroup", name) {
		if c.specHasNS(specs.CgroupNamespace) {
			return refuse(name, "", "missing: the container has a cgroup namespace, and without the image the restore would not create it")
		}
		return nil
	}
	var e cgroup.CgroupEntry
	if err := oneEntry(c.dir, name, "CGROUP", &e); err != nil {
		return asRefusal(name, err)
	}
	if len(e.GetControllers()) > maxCgroupControls {
		return refuse(name, "controllers", "%d entries; a node has at most %d hierarchies", len(e.GetControllers()), maxCgroupControls)
	}
	type ctl struct {
		names []string // sorted
		top   string   // "/" + the top directory
	}
	var ctls []ctl
	seen := map[string]bool{}
	c.cgroupTops = map[string]bool{}
	dirs := 0
	for i, ce := range e.GetControllers() {
		field := "controllers[" + itoa(i) + "]"
		names, err := checkCnames(name, field+" cnames", ce.GetCnames(), seen)
		if err != nil {
			return err
		}
		if len(ce.GetDirs()) > 1 {
			return refuse(name, field+" dirs", "%d top directories for %v; a container's tasks are in one cgroup", len(ce.GetDirs()), ce.GetCnames())
		}
		if len(ce.GetDirs()) == 0 {
			// A hierarchy no task is in: no member may name it.
			ctls = append(ctls, ctl{names: names})
			continue
		}
		d := ce.GetDirs()[0]
		top := d.GetDirName()
		if why := checkCgroupTop(top); why != "" {
			return refuse(name, field+" dirs dir_name", "%q %s", top, why)
		}
		budget := maxCgroupPath - len(strings.Join(names, ",")) - len(top) - 2
		if err := checkCgroupDir(name, field+" dir "+top, d, 0, budget, &dirs); err != nil {
			return err
		}
		ctls = append(ctls, ctl{names: names, top: "/" + top})
		c.cgroupTops["/"+top] = true
	}
	cgns := c.specHasNS(specs.CgroupNamespace)
	for _, set := range e.GetSets() {
		members := map[int]bool{}
		for _, m := range set.GetCtls() {
			field := "sets[" + itoa(set.GetId()) + "].ctls " + m.GetName()
			want := strings.Split(m.GetName(), ",")
			slices.Sort(want)
			idx := slices.IndexFunc(ctls, func(x ctl) bool { return slices.Equal(x.names, want) })
			if idx < 0 {
				return refuse(name, field+" name", "%q names no controller entry of the image", m.GetName())
			}
			if members[idx] {
				return refuse(name, field+" name", "%q twice in one set", m.GetName())
			}
			members[idx] = true
			p, top := m.GetPath(), ctls[idx].top
			if top == "" {
				return refuse(name, field+" path", "%q of a hierarchy the image gives no container cgroup: the task would leave the container's", p)
			}
			if why := checkPath(p); why != "" {
				return refuse(name, field+" path", "%q %s", p, why)
			}
			if p != top && !strings.HasPrefix(p, top+"/") {
				return refuse(name, field+" path", "%q is outside the container's cgroup %q", p, top)
			}
			switch {
			case cgns && m.GetCgnsPrefix() != uint32(len(top)):
				return refuse(name, field+" cgns_prefix", "%d; the container's cgroup namespace is rooted at its cgroup %q (%d)", m.GetCgnsPrefix(), top, len(top))
			case !cgns && m.GetCgnsPrefix() != 0:
				return refuse(name, field+" cgns_prefix", "%d; the container has no cgroup namespace", m.GetCgnsPrefix())
			}
		}
	}
	return nil
}

// checkCnames checks one controller entry's names and returns them sorted;
// seen holds the names of the entries before it.
func checkCnames(image, field string, cnames []string, seen map[string]bool) ([]string, error) {
	if len(cnames) == 0 || len(cnames) > maxCgroupCnames {
		return nil, refuse(image, field, "%d names; a hierarchy has 1 to %d", len(cnames), maxCgroupCnames)
	}
	for _, n := range cnames {
		switch {
		case n == "" && len(cnames) != 1:
			return nil, refuse(image, field, "the cgroup v2 hierarchy co-mounted with %v", cnames)
		case n != "" && !cgroupV1Controllers[n]:
			return nil, refuse(image, field, "%q is not a cgroup controller; CRIU would mount it as an option", n)
		case seen[n]:
			return nil, refuse(image, field, "%q in two entries", n)
		}
		seen[n] = true
	}
	names := slices.Clone(cnames)
	slices.Sort(names)
	return names, nil
}

// checkCgroupTop says why a top directory is not a container's cgroup
// path below the hierarchy's root ("" if it is).
func checkCgroupTop(top string) string {
	if top == "" {
		return "is the hierarchy's root; a container's cgroup is below it"
	}
	for _, part := range strings.Split(top, "/") {
		if !cgroupDirRE.MatchString(part) {
			return "is not a path of cgroup directory names"
		}
	}
	return ""
}

// checkCgroupDir checks a directory and those below it: names, depth,
// count and path length (budget is what is left of maxCgroupPath), its
// properties' names and values, and permissions.
//
// CRIU applies a directory's and its files' owner and mode as it finds
// them in the image, on directories that exist too (criu/cgroup.c,
// restore_perms): root's, and writable by root only, is what runc creates.
// Properties, and their permissions, are written only to directories the
// restore creates (below the container's), whose limits the kernel keeps
// within their parent's; the container's own directory exists, and its
// properties are not applied (CRIU 4 records them with unset permissions,
// e.g. freezer.state owned by 21845:1804961456, on this stack).
func checkCgroupDir(image, field string, d *cgroup.CgroupDirEntry, depth, budget int, dirs *int) error {
	if *dirs++; *dirs > maxCgroupDirs {
		return refuse(image, field, "more than %d cgroup directories", maxCgroupDirs)
	}
	if depth > maxCgroupDepth || budget < 0 {
		return refuse(image, field, "deeper than %d directories or %d bytes of path", maxCgroupDepth, maxCgroupPath)
	}
	if err := checkCgroupPerms(image, field+" dir_perms", d.DirPerms); err != nil {
		return err
	}
	for _, p := range d.GetProperties() {
		pf := field + " properties " + p.GetName()
		if !cgroupFileRE.MatchString(p.GetName()) || len(p.GetName())+1 > budget {
			return refuse(image, pf, "not a file name of a cgroup directory")
		}
		if len(p.GetValue()) > maxCgroupValue {
			return refuse(image, pf+" value", "%d bytes, more than %d", len(p.GetValue()), maxCgroupValue)
		}
		if depth == 0 {
			continue
		}
		if err := checkCgroupPerms(image, pf+" perms", p.Perms); err != nil {
			return err
		}
	}
	for _, ch := range d.GetChildren() {
		n := ch.GetDirName()
		cf := field + "/" + n
		if !cgroupDirRE.MatchString(n) {
			return refuse(image, field+" children dir_name", "%q is not one directory name", n)
		}
		if err := checkCgroupDir(image, cf, ch, depth+1, budget-len(n)-1, dirs); err != nil {
			return err
		}
	}
	return nil
}

func checkCgroupPerms(image, field string, p *cgroup.CgroupPerms) error {
	if p == nil {
		return nil
	}
	if p.GetUid() != 0 || p.GetGid() != 0 || p.GetMode()&0o022 != 0 {
		return refuse(image, field, "owner %d:%d mode %#o; the restore would give a cgroup of the host to others than root", p.GetUid(), p.GetGid(), p.GetMode())
	}
	return nil
}

// specHasNS reports whether the spec gives the container a namespace of
// type t.
func (c *checker) specHasNS(t specs.LinuxNamespaceType) bool {
	if c.p.spec.Linux == nil {
		return false
	}
	return slices.ContainsFunc(c.p.spec.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == t })
}
