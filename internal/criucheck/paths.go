package criucheck

import (
	"path"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// The path rules. CRIU opens the files an image names from the root of the
// container's mount namespace by a relative path (criu/files-reg.c,
// collect_one_regfile drops the name's first character, open_path and
// do_open_reg_noseek_flags call openat(mntns_root, path, flags)); it binds
// and unlinks unix sockets by their names after a chroot into that root
// (criu/sk-unix.c, prep_unix_sk_cwd, bind_unix_sk, unlink_sk); it opens an
// inotify watch's path with O_PATH (criu/fsnotify.c, get_mark_path); it
// chroots and chdirs a task into its root and cwd files (criu/files.c,
// restore_fs). All of it runs as root in a task that holds CRIU's service
// descriptors, among them the node's /proc (criu/include/servicefd.h,
// PROC_FD_OFF), so a path through /proc/self/fd/<n> or another of procfs's
// magic links would reach the node's files.
//
// A path CRIU writes is the d_path of the open file (criu/files-reg.c,
// dump_one_reg_file; fill_fdlink reads /proc/<pid>/fd/<n>): the file's own
// location, which never runs through a symbolic link, magic or not. The
// rules below hold every path to that form: lexically here, and against the
// container's file system in CheckAccess (resolve).

// openPathWhy says why name, a path the restore opens or creates from the
// container's root, is refused, or "". CRIU drops its first character, so it
// must be "/".
func (p *policy) openPathWhy(name string) string {
	if why := checkPath(name); why != "" {
		return why
	}
	if name[0] != '/' {
		return "is not absolute: CRIU drops its first character and opens the rest from the container's root"
	}
	return procWhy(p.spec.Mounts, splitPath(name))
}

// mountAt is the index of the spec mount container path cp is on (the
// deepest destination holding it; the later of equal ones, which runc mounts
// on top), or -1 for the root file system.
func mountAt(mounts []specs.Mount, dest func(int) string, cp string) int {
	best, bestLen := -1, -1
	for i := range mounts {
		d := dest(i)
		if (cp == d || d == "/" || strings.HasPrefix(cp, d+"/")) && len(d) >= bestLen {
			best, bestLen = i, len(d)
		}
	}
	return best
}

func specDest(mounts []specs.Mount) func(int) string {
	return func(i int) string { return path.Clean("/" + mounts[i].Destination) }
}

// procWhy applies the proc rule to a clean path given as components: on a
// proc mount of the spec, no magic link (procMagic).
func procWhy(mounts []specs.Mount, comps []string) string {
	cp := "/" + strings.Join(comps, "/")
	i := mountAt(mounts, specDest(mounts), cp)
	if i < 0 || mounts[i].Type != "proc" {
		return ""
	}
	d := specDest(mounts)(i)
	return procMagic(splitPath(strings.TrimPrefix(cp, d)))
}

// procMagic says why rel, the components of a path below a proc mount's
// root, runs through one of procfs's magic links, or "". Those are a
// process's or thread's root, cwd and exe (proc_pid_get_link), its open
// files (fd/<n>, proc_fd_link), its mapped files (map_files/<range>,
// proc_map_files_get_link) and its namespaces (ns/<type>,
// proc_ns_get_link), in fs/proc/base.c and fs/proc/namespaces.c of the
// kernel. They lead to whatever the process holds, wherever it is; no
// d_path of a file runs through one. The directories fd, map_files and ns
// themselves are not links (a process may hold /proc/self/fd open to list
// its descriptors).
//
// sysfs, cgroupfs (kernfs), devpts, mqueue and tmpfs have no magic links:
// kernfs's symbolic links are relative paths inside the same mount
// (fs/kernfs/symlink.c, kernfs_get_target_path), and the container's /sys is
// read-only (checkMounts keeps the spec's flags), so nothing is checked on
// them beyond the d_path rule of CheckAccess.
func procMagic(rel []string) string {
	if len(rel) == 0 {
		return ""
	}
	// The level components of a process or thread directory: /<pid>/,
	// /self/, /<pid>/task/<tid>/, /thread-self/.
	var levels []int
	switch {
	case rel[0] == "self" || isDigits(rel[0]):
		levels = append(levels, 1)
		if len(rel) > 3 && rel[1] == "task" && isDigits(rel[2]) {
			levels = append(levels, 3)
		}
	case rel[0] == "thread-self":
		levels = append(levels, 1)
	}
	for _, l := range levels {
		if l >= len(rel) {
			continue
		}
		switch rel[l] {
		case "root", "cwd", "exe":
			return "runs through /proc/" + strings.Join(rel[:l+1], "/") + ", a magic link of procfs that leads to whatever that process holds"
		case "fd", "map_files", "ns":
			if l+1 < len(rel) {
				return "runs through /proc/" + strings.Join(rel[:l+2], "/") + ", a magic link of procfs that leads to whatever that process holds"
			}
		}
	}
	return ""
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// uskPath is the path a unix socket's name binds or connects to, "" for an
// abstract or unnamed socket, or why the name is refused. A relative name is
// resolved from name_dir, the directory CRIU chdirs into first (criu/sk-unix.c,
// prep_unix_sk_cwd), or else from the container's root, where CRIU chroots.
func uskPath(name []byte, nameDir string) (string, string) {
	if len(name) == 0 || name[0] == 0 {
		return "", ""
	}
	n := string(name)
	if strings.IndexByte(n, 0) >= 0 {
		return "", "has a NUL"
	}
	if n[0] != '/' {
		dir := "/"
		if nameDir != "" {
			if why := checkPath(nameDir); why != "" || nameDir[0] != '/' {
				return "", "is relative to name_dir " + quote(nameDir) + ", which is not a clean absolute path"
			}
			dir = nameDir
		}
		n = strings.TrimSuffix(dir, "/") + "/" + n
	}
	return n, ""
}

func quote(s string) string { return "\"" + strings.ReplaceAll(s, "\"", "\\\"") + "\"" }
