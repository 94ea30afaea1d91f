package criucheck

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	fsimg "github.com/checkpoint-restore/go-criu/v8/crit/images/fs"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// maxSymlinks is the kernel's bound on symbolic links followed in one
// lookup (include/linux/namei.h, MAXSYMLINKS).
const maxSymlinks = 40

// CheckAccess refuses the images in dir when a path they name would reach
// past the container's own files, or when they hold a file open that the
// container's own user could not open. rootfs is the container's root file
// system as runc will use it, with the checkpoint's rootfs changes applied;
// the spec's bind mounts are followed to their sources. A refusal is a
// *Refusal naming the file.
//
// Paths, for every user: each path the restore opens, binds or watches
// (files.img's regular files, among them the tasks' roots, cwds and
// executables; inotify watches; bound unix sockets) is resolved within the
// container's view (resolve). A regular file's or a watch's path is the
// d_path CRIU recorded, so a symbolic link at any of its components but the
// last is refused, and at the last one too unless the file was opened
// O_PATH|O_NOFOLLOW (the link itself; CRIU opens it with the same flags,
// criu/files-reg.c, do_open_reg_noseek_flags). A socket's name is the one it
// was bound by, which may run through links; they are followed. No path may
// reach a magic link of a proc mount (procMagic). Links in a tmpfs mount are
// those of its image (tmpfs-dev-*.tar.gz.img), which the restore extracts
// there.
//
// Access, not for a user who may bypass file permissions (CAP_DAC_OVERRIDE,
// CAP_FOWNER, CAP_SETUID in the spec's permitted set): CRIU opens every file
// of files.img by its path as root (criu/files-reg.c, do_open_reg), past the
// file's owner and mode, so a checkpoint could name a root-only file of the
// image or of a volume (a Secret's key with mode 0400, say) and the restored
// process would hold it open. Each directory on the way must be searchable
// and the file open-able with the access its flags ask (a task's root and
// cwd: searchable; its executable: executable; an inotify watch: readable,
// as inotify_add_watch asks) for the spec's user. CAP_DAC_READ_SEARCH reads
// anything. Files that do not exist (CRIU's open fails and the restore with
// it), files remapped to a copy in the images (remap-fpath.img: ghost files,
// whose mode checkGhosts bounds), and files on mounts that are not binds
// (proc, sysfs, tmpfs, devpts, mqueue: the kernel's own or refilled from the
// images) are not checked for access.
func CheckAccess(dir string, spec *specs.Spec, rootfs string) error {
	if spec == nil || spec.Process == nil {
		return errors.New("the container's runtime spec has no process")
	}
	p := policyOf(spec)
	const name = "files.img"
	if _, err := os.Lstat(path.Join(dir, name)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	remapped := map[uint32]bool{}
	const remaps = "remap-fpath.img"
	if _, err := os.Lstat(path.Join(dir, remaps)); err == nil {
		err := eachEntry(dir, remaps, "REMAP_FPATH", func() *remap.RemapFilePathEntry { return new(remap.RemapFilePathEntry) }, func(e *remap.RemapFilePathEntry) error {
			// A linked remap opens the original's path; Check refuses it.
			if t := remapTypeOf(e); t == remap.RemapType_GHOST || t == remap.RemapType_PROCFS {
				remapped[e.GetOrigId()] = true
			}
			return nil
		})
		if err != nil {
			return asRefusal(remaps, err)
		}
	}
	searched, err := searchedFiles(dir)
	if err != nil {
		return err
	}
	writes, err := mappedWrites(dir)
	if err != nil {
		return err
	}
	links, err := tmpfsLinks(dir)
	if err != nil {
		return err
	}
	v := newView(rootfs, spec.Mounts, p, links)
	perms := !p.passesFilePerms()
	err = eachEntry(dir, name, "FILES", func() *fdinfo.FileEntry { return new(fdinfo.FileEntry) }, func(f *fdinfo.FileEntry) error {
		field := func(s string) string { return "file " + itoa(f.GetId()) + " " + f.GetType().String() + " " + s }
		check := func(fieldName, p string, w walk) error {
			if why, _ := v.resolve(p, w); why != "" {
				return refuse(name, field(fieldName), "%q: %s", p, why)
			}
			return nil
		}
		switch f.GetType() {
		case fdinfo.FdTypes_REG:
			r := f.GetReg()
			if r == nil {
				return nil
			}
			if why := p.openPathWhy(r.GetName()); why != "" { // Check refuses these too
				return refuse(name, field("reg.name"), "%q %s", r.GetName(), why)
			}
			w := walk{strict: true, want: accessOf(r.GetFlags()), perms: perms && !remapped[f.GetId()]}
			if want, ok := searched[f.GetId()]; ok {
				w.want = want
			}
			w.want |= writes[f.GetId()]
			if r.GetFlags()&(unix.O_PATH|unix.O_NOFOLLOW) == unix.O_PATH|unix.O_NOFOLLOW {
				w.last = lastKeep
			}
			return check("reg.name", r.GetName(), w)
		case fdinfo.FdTypes_INOTIFY:
			for _, wd := range f.GetIfy().GetWd() {
				p := wd.GetFHandle().GetPath()
				if p == "" {
					continue // Check refuses a watch without a path
				}
				// CRIU opens the path with O_PATH, following a last link
				// (criu/fsnotify.c, get_mark_path).
				if err := check("ify.wd.f_handle.path", p, walk{strict: true, last: lastFollow, want: mayRead, perms: perms}); err != nil {
					return err
				}
			}
		case fdinfo.FdTypes_UNIXSK:
			u := f.GetUsk()
			sp, why := uskPath(u.GetName(), u.GetNameDir())
			if why != "" {
				return refuse(name, field("usk.name"), "%q %s", u.GetName(), why)
			}
			if sp != "" {
				// bind does not follow a last link; it fails on it.
				return check("usk.name", sp, walk{last: lastKeep})
			}
		}
		return nil
	})
	if err != nil {
		return asRefusal(name, err)
	}
	return nil
}

// searchedFiles are the files the restore opens for a task's root, cwd
// (fs-*.img; criu/files.c, restore_fs: chroot and chdir, for which a
// directory need only be searchable) and executable (mm-*.img exe_file_id,
// which needs the execute bit), by file ID, with the access each needs.
// CRIU dumps them with flags 0 (criu/cr-dump.c, fill_fd_params_special),
// which would otherwise read as O_RDONLY.
func searchedFiles(dir string) (map[uint32]uint32, error) {
	out := map[uint32]uint32{}
	var e fsimg.FsEntry
	err := eachImageEntry(dir, fsImage, "FS", &e, func() {
		out[e.GetRootId()] = mayExec
		out[e.GetCwdId()] = mayExec
	})
	if err != nil {
		return nil, err
	}
	var m mm.MmEntry
	err = eachImageEntry(dir, mmImage, "MM", &m, func() {
		if id := m.GetExeFileId(); id != 0 {
			out[id] = mayExec
		}
	})
	return out, err
}

// eachImageEntry decodes the one entry of every image of dir that re
// matches into m and calls fn.
func eachImageEntry(dir string, re *regexp.Regexp, magic string, m proto.Message, fn func()) error {
	names, err := imageNames(dir, re)
	if err != nil {
		return err
	}
	for _, n := range names {
		proto.Reset(m)
		if err := oneEntry(dir, n, magic, m); err != nil {
			return asRefusal(n, err)
		}
		fn()
	}
	return nil
}

var (
	fsImage = regexp.MustCompile(`^fs-[0-9]+\.img$`)
	mmImage = regexp.MustCompile(`^mm-[0-9]+\.img$`)
)

// imageNames are the names in dir that re matches.
func imageNames(dir string, re *regexp.Regexp) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	all, err := d.Readdirnames(maxImageFiles + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(all) > maxImageFiles {
		return nil, refuse(dir, "", "more than %d image files", maxImageFiles)
	}
	var out []string
	for _, n := range all {
		if re.MatchString(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Access bits, as in a file's mode (other's).
const (
	mayExec  = 1
	mayWrite = 2
	mayRead  = 4
)

// accessOf is the access an open with flags asks of a file.
func accessOf(flags uint32) uint32 {
	if flags&unix.O_PATH != 0 {
		return 0
	}
	switch flags & unix.O_ACCMODE {
	case unix.O_WRONLY:
		return mayWrite
	case unix.O_RDWR:
		return mayRead | mayWrite
	}
	return mayRead
}

// view is the container's file system as the restore will see it: the
// root file system, the spec's mounts on it at their destinations as runc
// resolves them, and the symbolic links of the tmpfs mounts' images.
type view struct {
	rootfs string
	mounts []specs.Mount
	p      *policy
	links  map[string]string // container path -> link target, in tmpfs mounts
	// dests are the mounts' destinations resolved within the view of the
	// mounts before them: runc mounts in the spec's order and follows
	// links in a destination inside the root file system
	// (libcontainer/rootfs_linux.go, mountToRootfs with securejoin), so
	// /var/run/secrets with /var/run -> /run is mounted at /run/secrets.
	dests  []string
	active int // mounts in place: dests[:active]
}

func newView(rootfs string, mounts []specs.Mount, p *policy, links map[string]string) *view {
	v := &view{rootfs: rootfs, mounts: mounts, p: p, links: links, dests: make([]string, len(mounts))}
	for i, m := range mounts {
		v.active = i
		_, v.dests[i] = v.resolve(path.Clean("/"+m.Destination), walk{last: lastFollow})
	}
	v.active = len(mounts)
	return v
}

// Where a container path lies.
const (
	onRoot   = iota // the root file system
	onBind          // a bind mount: its source on the host
	onProc          // a proc mount
	onTmpfs         // a tmpfs: refilled from its image
	onKernel        // sysfs, devpts, mqueue, cgroup: the kernel's, no magic links
)

// locate says where container path cp lies and, on the host's file
// systems, its host path; m is the mount's index (-1 for the root).
func (v *view) locate(cp string) (kind int, host string, m int) {
	m = mountAt(v.mounts[:v.active], func(i int) string { return v.dests[i] }, cp)
	if m < 0 {
		return onRoot, v.rootfs + cp, m
	}
	mt := v.mounts[m]
	switch {
	case isBind(mt):
		return onBind, mt.Source + strings.TrimPrefix(cp, v.dests[m]), m
	case mt.Type == "proc":
		return onProc, "", m
	case mt.Type == "tmpfs":
		return onTmpfs, "", m
	}
	return onKernel, "", m
}

// mountBelow reports whether a mount of the spec is below container path cp.
func (v *view) mountBelow(cp string) bool {
	for _, d := range v.dests[:v.active] {
		if strings.HasPrefix(d, cp+"/") {
			return true
		}
	}
	return false
}

func isBind(m specs.Mount) bool {
	if m.Type == "bind" || m.Type == "rbind" {
		return true
	}
	for _, o := range m.Options {
		if o == "bind" || o == "rbind" {
			return true
		}
	}
	return false
}

// What a walk does with a symbolic link at the path's last component.
const (
	lastRefuse = iota // refused: an opened file's d_path never ends in one
	lastKeep          // the link itself is the file (O_PATH|O_NOFOLLOW, a socket's bind)
	lastFollow        // followed, as CRIU's open does
)

// walk is how resolve walks a path.
type walk struct {
	// strict: the path is a d_path, so a symbolic link before its last
	// component is refused (after a last link is followed, the target's
	// own components are not: they are the link's, not CRIU's record).
	strict bool
	last   int
	// perms: check that the spec's user may search every directory on
	// the way and open the file with access want.
	perms bool
	want  uint32
}

// resolve walks container path p as the kernel would within the view,
// following symbolic links as w says, and returns why p is refused ("" if
// it is not, or if it leads where nothing is checked: a missing file, whose
// open fails for CRIU too, or a kernel file system) and the container path
// it resolves to (as far as it resolves; the rest is appended).
func (v *view) resolve(p string, w walk) (why, resolved string) {
	comps := splitPath(p)
	cur, links, followed := "/", 0, false
	rest := func(i int) string { return path.Join(append([]string{cur}, comps[i:]...)...) }
	for i := 0; i < len(comps); i++ {
		next := path.Join(cur, comps[i])
		last := i == len(comps)-1
		kind, h, m := v.locate(next)
		var (
			st      unix.Stat_t
			statted bool
			isLink  bool
			target  string
		)
		switch kind {
		case onProc:
			rel := append(splitPath(strings.TrimPrefix(next, v.dests[m])), comps[i+1:]...)
			if why := procMagic(rel); why != "" {
				return "it resolves to " + path.Join(v.dests[m], strings.Join(rel, "/")) + ", which " + why, ""
			}
			return "", rest(i)
		case onKernel:
			return "", rest(i)
		case onTmpfs:
			target, isLink = v.links[next]
		default:
			var err error
			if kind == onBind && next == v.dests[m] {
				err = unix.Stat(h, &st) // the mount's source, as mount(2) found it
			} else {
				err = unix.Lstat(h, &st)
			}
			if err != nil {
				// A directory a mount is below, not made yet: runc makes
				// the mountpoints of a restored container at start, as
				// root with mode 0755 (libcontainer/rootfs_linux.go,
				// createIfNotExists), so anyone may search it.
				if errors.Is(err, unix.ENOENT) && !last && v.mountBelow(next) {
					cur = next
					continue
				}
				return "", rest(i) // CRIU's open fails the same way
			}
			statted = true
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				isLink = true
				if target, err = os.Readlink(h); err != nil {
					return "", rest(i)
				}
			}
		}
		if isLink {
			switch {
			case !last && w.strict && !followed:
				return "component " + next + " is a symbolic link; CRIU records an open file's own path (its d_path), which never runs through one", ""
			case last && w.last == lastKeep:
				return "", next
			case last && w.last == lastRefuse:
				return next + " is a symbolic link; CRIU records an open file's own path (its d_path), which never ends in one unless the file is the link itself (O_PATH|O_NOFOLLOW)", ""
			}
			if links++; links > maxSymlinks {
				return "too many levels of symbolic links", ""
			}
			base := cur
			if strings.HasPrefix(target, "/") {
				base = "/"
			}
			comps = append(splitPath(path.Join(base, target)), comps[i+1:]...)
			cur, i, followed = "/", -1, true
			continue
		}
		if statted && !last {
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return "", rest(i) // ENOTDIR for CRIU too
			}
			if w.perms && !v.p.permits(&st, mayExec) {
				return "directory " + next + " is " + modeOwner(&st) + ": uid " + itoa(v.p.uid) + " cannot search it", ""
			}
		}
		if statted && last && w.perms && !v.p.permits(&st, w.want) {
			return modeOwner(&st) + ": uid " + itoa(v.p.uid) + " cannot open it for " + accessName(w.want), ""
		}
		cur = next
	}
	return "", cur
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// permits is the kernel's generic_permission for the spec's user without
// ACLs: the owner's bits for the owner, the group's for a member, the
// others' otherwise; CAP_DAC_READ_SEARCH reads any file and searches any
// directory.
func (p *policy) permits(st *unix.Stat_t, want uint32) bool {
	if p.holds("CAP_DAC_READ_SEARCH") && want&mayWrite == 0 && (want&mayExec == 0 || st.Mode&unix.S_IFMT == unix.S_IFDIR) {
		return true
	}
	mode := st.Mode & 0o7
	switch {
	case st.Uid == p.uid:
		mode = (st.Mode >> 6) & 0o7
	case p.groups[st.Gid]:
		mode = (st.Mode >> 3) & 0o7
	}
	return mode&want == want
}

func modeOwner(st *unix.Stat_t) string {
	return fmt.Sprintf("mode %#o owned by %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
}

func accessName(want uint32) string {
	switch want {
	case mayExec:
		return "executing or searching"
	case mayWrite:
		return "writing"
	case mayRead | mayWrite:
		return "reading and writing"
	}
	return "reading"
}
