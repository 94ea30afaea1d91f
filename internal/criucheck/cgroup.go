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

// checkCgroupDir refuses permissions the restore would set and, on the
// container's own directory, properties (its limits are the runtime's).
func checkCgroupDir(image string, d *cgroup.CgroupDirEntry, top bool) error {
	field := "dir " + d.GetDirName()
	if why := checkPath(d.GetDirName()); why != "" {
		return refuse(image, field, "%s", why)
	}
	if d.DirPerms != nil {
		return refuse(image, field+" dir_perms", "the restore would chown the directory")
	}
	for _, p := range d.GetProperties() {
		if top {
			return refuse(image, field+" properties", "%q: the container's own cgroup keeps the runtime's limits", p.GetName())
		}
		if p.Perms != nil {
			return refuse(image, field+" properties "+p.GetName(), "the restore would chown the file")
		}
	}
	for _, ch := range d.GetChildren() {
		if err := checkCgroupDir(image, ch, false); err != nil {
			return err
		}
	}
	return nil
}
