package criucheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// maxSymlinks is the kernel's bound on symbolic links followed in one
// lookup (include/linux/namei.h, MAXSYMLINKS).
const maxSymlinks = 40

// CheckAccess refuses the images in dir when they hold a file open that the
// container's own user could not open: CRIU opens every file of files.img
// by its path as root (criu/files-reg.c, do_open_reg), past the file's
// owner and mode, so a checkpoint could name a root-only file of the image
// or of a volume (a Secret's key with mode 0400, say) and the restored
// process would hold it open. rootfs is the container's root file system
// as runc will use it, with the checkpoint's rootfs changes applied; the
// spec's bind mounts are followed to their sources. A refusal is a
// *Refusal naming the file.
//
// Files that do not exist (CRIU's open fails and the restore with it),
// files remapped to a copy in the images (remap-fpath.img: ghost files,
// whose mode checkGhosts bounds), and files on mounts that are not binds
// (proc, sysfs, tmpfs, devpts, mqueue: the kernel's own or refilled from
// the images) are not checked here. A user who may bypass file permissions
// (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETUID in the spec's permitted set)
// is not checked either; CAP_DAC_READ_SEARCH lets it read anything.
func CheckAccess(dir string, spec *specs.Spec, rootfs string) error {
	if spec == nil || spec.Process == nil {
		return errors.New("the container's runtime spec has no process")
	}
	p := policyOf(spec)
	if p.may("CAP_DAC_OVERRIDE") || p.may("CAP_FOWNER") || p.may("CAP_SETUID") {
		return nil
	}
	const name = "files.img"
	if _, err := os.Lstat(path.Join(dir, name)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	remapped := map[uint32]bool{}
	const remaps = "remap-fpath.img"
	if _, err := os.Lstat(path.Join(dir, remaps)); err == nil {
		err := eachEntry(dir, remaps, "REMAP_FPATH", func() *remap.RemapFilePathEntry { return new(remap.RemapFilePathEntry) }, func(e *remap.RemapFilePathEntry) error {
			remapped[e.GetOrigId()] = true
			return nil
		})
		if err != nil {
			return asRefusal(remaps, err)
		}
	}
	v := &view{rootfs: rootfs, mounts: spec.Mounts, p: p}
	err := eachEntry(dir, name, "FILES", func() *fdinfo.FileEntry { return new(fdinfo.FileEntry) }, func(f *fdinfo.FileEntry) error {
		r := f.GetReg()
		if f.GetType() != fdinfo.FdTypes_REG || r == nil || remapped[f.GetId()] {
			return nil
		}
		if why := checkPath(r.GetName()); why != "" { // Check refuses these too
			return refuse(name, "file "+itoa(f.GetId())+" REG reg.name", "%q %s", r.GetName(), why)
		}
		want := accessOf(r.GetFlags())
		if why := v.denied(r.GetName(), want); why != "" {
			return refuse(name, "file "+itoa(f.GetId())+" REG reg.name", "%q: %s", r.GetName(), why)
		}
		return nil
	})
	if err != nil {
		return asRefusal(name, err)
	}
	return nil
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

// view resolves the container's paths to the host's: a path under a bind
// mount's destination is under its source, any other under rootfs.
type view struct {
	rootfs string
	mounts []specs.Mount
	p      *policy
}

// host is container path cp on the host; false when cp is on a mount that
// is not a bind (not modelled here).
func (v *view) host(cp string) (string, bool) {
	best, bestLen := -1, -1
	for i, m := range v.mounts {
		d := path.Clean("/" + m.Destination)
		if (cp == d || d == "/" || strings.HasPrefix(cp, d+"/")) && len(d) >= bestLen {
			best, bestLen = i, len(d) // the later of equal destinations is on top
		}
	}
	if best < 0 {
		return v.rootfs + cp, true
	}
	m := v.mounts[best]
	if !isBind(m) {
		return "", false
	}
	d := path.Clean("/" + m.Destination)
	return m.Source + strings.TrimPrefix(cp, d), true
}

// mountBelow reports whether a mount of the spec is below container path cp.
func (v *view) mountBelow(cp string) bool {
	for _, m := range v.mounts {
		if strings.HasPrefix(path.Clean("/"+m.Destination), cp+"/") {
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

// denied walks container path p as the kernel would for the container's
// user, following symbolic links within the container's view, and says
// why the user could not open it with access want ("" if it could, or if
// the path is not checked here).
func (v *view) denied(p string, want uint32) string {
	comps := splitPath(p)
	cur, links := "/", 0
	for i := 0; i < len(comps); i++ {
		next := path.Join(cur, comps[i])
		h, ok := v.host(next)
		if !ok {
			return ""
		}
		last := i == len(comps)-1
		var st unix.Stat_t
		if err := unix.Lstat(h, &st); err != nil {
			// A directory a mount is below, not made yet: runc makes the
			// mountpoints of a restored container at start, as root with
			// mode 0755 (libcontainer/rootfs_linux.go, createIfNotExists),
			// so anyone may search it.
			if errors.Is(err, unix.ENOENT) && !last && v.mountBelow(next) {
				cur = next
				continue
			}
			return "" // CRIU's open fails the same way
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if links++; links > maxSymlinks {
				return "too many levels of symbolic links"
			}
			target, err := os.Readlink(h)
			if err != nil {
				return ""
			}
			base := cur
			if strings.HasPrefix(target, "/") {
				base = "/"
			}
			comps = append(splitPath(path.Join(base, target)), comps[i+1:]...)
			cur, i = "/", -1
			continue
		}
		if !last {
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return "" // ENOTDIR for CRIU too
			}
			if !v.p.permits(&st, mayExec) {
				return "directory " + next + " is " + modeOwner(&st) + ": uid " + itoa(v.p.uid) + " cannot search it"
			}
			cur = next
			continue
		}
		if !v.p.permits(&st, want) {
			return modeOwner(&st) + ": uid " + itoa(v.p.uid) + " cannot open it for " + accessName(want)
		}
	}
	return ""
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
	if p.may("CAP_DAC_READ_SEARCH") && want&mayWrite == 0 && (want&mayExec == 0 || st.Mode&unix.S_IFMT == unix.S_IFDIR) {
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
	case mayWrite:
		return "writing"
	case mayRead | mayWrite:
		return "reading and writing"
	}
	return "reading"
}
