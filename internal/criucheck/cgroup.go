package criucheck

import (
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
)

// checkCgroup reads cgroup.img. In runc's default soft mode CRIU moves each
// task into the cgroup the image names below the container's, creates the
// directories it lists and writes their properties and permissions
// (criu/cgroup.c, prepare_task_cgroup, prepare_cgroup_dirs): a member path
// outside the controller's top directory would move the task into a cgroup
// of the host, free of the container's limits.
func (c *checker) checkCgroup() error {
	const name = "cgroup.img"
	if !c.has("cgroup", name) {
		return nil
	}
	var e cgroup.CgroupEntry
	if err := oneEntry(c.dir, name, "CGROUP", &e); err != nil {
		return asRefusal(name, err)
	}
	tops := map[string]string{} // controller name -> its top directory
	c.cgroupTops = map[string]bool{}
	for _, ctl := range e.GetControllers() {
		if len(ctl.GetDirs()) > 1 {
			return refuse(name, "controllers.dirs", "controller %v has %d top directories; a container's tasks are in one", ctl.GetCnames(), len(ctl.GetDirs()))
		}
		for _, d := range ctl.GetDirs() {
			if err := checkCgroupDir(name, d, true); err != nil {
				return err
			}
			for _, n := range ctl.GetCnames() {
				tops[n] = d.GetDirName()
			}
			c.cgroupTops["/"+strings.TrimPrefix(d.GetDirName(), "/")] = true
		}
	}
	for _, set := range e.GetSets() {
		for _, m := range set.GetCtls() {
			top, ok := tops[m.GetName()]
			p := m.GetPath()
			field := "sets.ctls " + m.GetName()
			if why := checkPath(p); why != "" {
				return refuse(name, field, "path %q %s", p, why)
			}
			if ok && p != "/"+strings.TrimPrefix(top, "/") && !strings.HasPrefix(p, "/"+strings.TrimPrefix(top, "/")+"/") {
				return refuse(name, field, "path %q is outside the container's cgroup %q", p, top)
			}
			if !ok && p != "/" {
				return refuse(name, field, "path %q of a controller cgroup.img does not describe", p)
			}
			if m.CgnsPrefix != nil && int(m.GetCgnsPrefix()) < len("/"+strings.TrimPrefix(top, "/")) {
				return refuse(name, field+" cgns_prefix", "%d puts the cgroup namespace's root above the container's cgroup", m.GetCgnsPrefix())
			}
		}
	}
	return nil
}

// checkCgroupDir refuses permissions that would open a cgroup of the host
// to others: CRIU applies a directory's and its files' owner and mode as it
// finds them in the image, on directories that exist too (criu/cgroup.c,
// restore_perms). Root's, and writable by root only, is what runc creates.
// Properties, and their permissions, are written only to directories the
// restore creates (below the container's), whose limits the kernel keeps
// within their parent's; the container's own directory exists, and its
// properties are not applied (CRIU 4 records them with unset permissions,
// e.g. freezer.state owned by 21845:1804961456, on this stack).
func checkCgroupDir(image string, d *cgroup.CgroupDirEntry, top bool) error {
	field := "dir " + d.GetDirName()
	if why := checkPath(d.GetDirName()); why != "" {
		return refuse(image, field, "%s", why)
	}
	if err := checkCgroupPerms(image, field+" dir_perms", d.DirPerms); err != nil {
		return err
	}
	for _, p := range d.GetProperties() {
		if top {
			break
		}
		if err := checkCgroupPerms(image, field+" properties "+p.GetName()+" perms", p.Perms); err != nil {
			return err
		}
	}
	for _, ch := range d.GetChildren() {
		if err := checkCgroupDir(image, ch, false); err != nil {
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
