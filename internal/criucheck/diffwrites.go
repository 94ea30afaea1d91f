package criucheck

// Where a rootfs diff may write. Filter's rules bound each entry by itself,
// but the applier writes as root wherever an entry names: in a pod of user
// 1000, a diff could replace /etc/shadow or /etc/sudoers, and a set-user-ID
// program of the image (su, sudo) would then read them. So while the diff is
// applied, each entry is also held to what the container's own user could
// have done to the rootfs as it is then, the diff's earlier entries applied
// (RootfsDiff.ApplyFilter): the kernel's permission checks for the spec's
// uid and groups (policy.permits), as creat, mkdir, symlink, link, unlink,
// rmdir, open(O_TRUNC), chown and chmod make them. Not for a spec whose
// processes get past any file's owner and mode (policy.passesFilePerms).
//
// Entry by entry, parent is the directory the entry lands in:
//   - the path: every directory down to parent exists, none of them a
//     symbolic link (containerd's diffs name each entry by its own path and
//     carry its directories before it; the applier would make a missing one
//     as root and follow a link), each searchable by the user;
//   - a new name: the user may write parent; the new file, directory or
//     symlink is the user's, in one of its groups (or parent's group when
//     parent is set-group-ID), unless the spec has CAP_CHOWN;
//   - an existing regular file replaced by a regular file: either the user
//     could write it in place (open with O_TRUNC: it owns it or may write
//     it), and then the file keeps its owner and mode unless the user owns
//     it (chown needs CAP_CHOWN, chmod the owner); or it could remove it and
//     create a new one (below), and then the new file is its own;
//   - any other existing entry replaced: the user may remove it from parent
//     (write on parent; in a sticky parent it owns the entry or parent; a
//     directory is emptied the same way, entry by entry) and create the new
//     one;
//   - an existing directory named again as a directory (containerd's diffs
//     carry the changed files' directories): the applier sets its owner,
//     mode and extended attributes, so those may change only as the user
//     could change them; equal ones (a modification time aside) are no
//     change at all;
//   - a whiteout removes as unlink or rmdir would; an opaque whiteout
//     empties parent (even of entries the diff put there first, which the
//     applier keeps: stricter);
//   - a hard link: its target is one fs.protected_hardlinks lets the user
//     link (its own, or a regular file it may read and write, not
//     set-user-ID, not set-group-ID and group-executable), and the entry's
//     owner and mode, which the applier gives the target, change as for a
//     directory named again;
//   - what runc makes itself when it starts the container: the spec's mount
//     destinations and the process's cwd, resolved in the rootfs as runc
//     resolves them, and their parent directories, are made by runc as root
//     with mode 0755 (libcontainer/rootfs_linux.go, createIfNotExists and
//     the cwd's MkdirAll) and so are in containerd's diff of a container of
//     any user. A new directory there, or an empty regular file at a
//     destination, owned by 0:0 with no mode bit beyond 0755 and no extended
//     attribute, is what runc makes anyway at the restore's start, and is
//     taken as it is.
//
// Volumes are not in the rootfs while the diff is applied: an entry below a
// mount destination lands in the rootfs beneath the mountpoint, hidden once
// runc mounts there, and is held to the same rules as any other. containerd's
// diffs never have one: a volume's files are not in the container's
// overlay upper directory.

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ApplyFilter is the filter of archive.Apply applying the diff onto rootfs,
// the container's root file system as the runtime shim has mounted it: each
// header is decided by Filter's rules, then by what the container's user
// could have written to rootfs as it is when the entry comes.
func (d *RootfsDiff) ApplyFilter(rootfs string) func(*tar.Header) (bool, error) {
	w := newDiffWrites(rootfs, d.p)
	return func(h *tar.Header) (bool, error) {
		if err := d.header(h); err != nil {
			return false, err
		}
		if err := w.entry(h); err != nil {
			return false, err
		}
		return true, nil
	}
}

// diffWrites checks the entries of one diff against rootfs.
type diffWrites struct {
	rootfs string
	p      *policy
	// any: the user may write any file; nothing is checked.
	any bool
	// runc are the container paths runc makes as root at start: the
	// mount destinations and the cwd, resolved in the rootfs.
	runc []string
	// budget is how many more files the removals of this diff may look at.
	budget int
}

func newDiffWrites(rootfs string, p *policy) *diffWrites {
	w := &diffWrites{rootfs: filepath.Clean(rootfs), p: p, any: p.passesFilePerms(), budget: maxDiffEntries}
	if w.any {
		return w
	}
	v := newView(w.rootfs, p.spec.Mounts, p, nil)
	for _, d := range v.dests {
		if d != "" && d != "/" {
			w.runc = append(w.runc, d)
		}
	}
	if cwd := p.spec.Process.Cwd; cwd != "" {
		if why, c := v.resolve(path.Clean("/"+cwd), walk{last: lastFollow}); why == "" && c != "/" {
			w.runc = append(w.runc, c)
		}
	}
	return w
}

// node is a file of the rootfs by its container path; st is its lstat when
// it exists.
type node struct {
	path   string
	st     unix.Stat_t
	exists bool
}

func (n *node) is(mode uint32) bool { return n.exists && n.st.Mode&unix.S_IFMT == mode }

func (w *diffWrites) lstat(p string) (node, error) {
	n := node{path: p}
	err := unix.Lstat(w.rootfs+p, &n.st)
	switch {
	case err == nil:
		n.exists = true
	case errors.Is(err, unix.ENOENT):
		err = nil
	default:
		err = fmt.Errorf("rootfs %s: %w", p, err)
	}
	return n, err
}

// entry refuses h unless the user could have written it to the rootfs as
// it is now.
func (w *diffWrites) entry(h *tar.Header) error {
	name := path.Clean(h.Name)
	if w.any || name == "." { // the applier skips the rootfs itself
		return nil
	}
	dir, base := path.Split(name)
	parent, search, why, err := w.walkDir("/" + dir)
	what := "path"
	if err == nil && why == "" {
		if strings.HasPrefix(base, whiteoutPrefix) {
			what = "whiteout"
			if why = search; why == "" {
				why, err = w.whiteout(parent, base)
			}
		} else {
			what, why, err = w.put(h, parent, base, search)
		}
	}
	if err != nil {
		return fmt.Errorf("rootfs diff entry %s: %w", cutName(h.Name, 256), err)
	}
	if why != "" {
		return refuse(RootfsDiffImage, entryField(h.Name, what), "%s", why)
	}
	return nil
}

// walkDir walks container directory dir of the rootfs as the applier
// reaches it. why is set when it is not a path of directories (missing, a
// symbolic link, a file); search when the user may not search one of them.
func (w *diffWrites) walkDir(dir string) (n node, search, why string, err error) {
	if n, err = w.lstat("/"); err != nil {
		return n, "", "", err
	}
	if !n.exists {
		return n, "", "", errors.New("no rootfs at " + w.rootfs)
	}
	comps := splitPath(dir)
	for i := 0; ; i++ {
		if search == "" && !w.p.permits(&n.st, mayExec) {
			search = fmt.Sprintf("uid %d cannot search %s (%s)", w.p.uid, n.path, modeOwner(&n.st))
		}
		if i == len(comps) {
			return n, search, "", nil
		}
		next := path.Join(n.path, comps[i])
		if n, err = w.lstat(next); err != nil {
			return n, "", "", err
		}
		switch {
		case !n.exists:
			return n, "", "directory " + next + " does not exist: the applier would make it as root, and a diff carries each entry's directories before it", nil
		case n.is(unix.S_IFLNK):
			return n, "", next + " is a symbolic link, which the applier would follow: a diff names each entry by its own path", nil
		case !n.is(unix.S_IFDIR):
			return n, "", next + " is not a directory", nil
		}
	}
}

// put decides an entry that is not a whiteout, named base in parent.
func (w *diffWrites) put(h *tar.Header, parent node, base, search string) (what, why string, err error) {
	cur, err := w.lstat(path.Join(parent.path, base))
	if err != nil {
		return "", "", err
	}
	if !cur.exists && w.runcMakes(h, cur.path) {
		return "", "", nil
	}
	if search != "" {
		return "write", search, nil
	}
	switch {
	case cur.is(unix.S_IFDIR) && h.Typeflag == tar.TypeDir:
		what, why := w.changeWhy(h, &cur)
		return what, why, nil
	case cur.is(unix.S_IFREG) && h.Typeflag == tar.TypeReg:
		inPlace := w.overwriteWhy(h, &cur)
		if inPlace == "" {
			return "", "", nil
		}
		gone, err := w.removeWhy(&parent, &cur)
		if err != nil || gone != "" {
			return "write", inPlace + "; nor remove it: " + gone, err
		}
	case cur.exists:
		gone, err := w.removeWhy(&parent, &cur)
		if err != nil || gone != "" {
			return "write", fmt.Sprintf("uid %d cannot replace %s: %s", w.p.uid, cur.path, gone), err
		}
	}
	if !w.p.permits(&parent.st, mayWrite|mayExec) {
		return "write", fmt.Sprintf("uid %d cannot create %s: it cannot write %s (%s)", w.p.uid, cur.path, parent.path, modeOwner(&parent.st)), nil
	}
	if h.Typeflag == tar.TypeLink {
		return w.link(h)
	}
	return "owner", w.newOwnerWhy(h, &parent, cur.path), nil
}

// runcMakes reports whether h is what runc makes itself at p at the
// container's start: a directory at or above a mount destination or the
// cwd, or an empty file at a destination; root's, mode 0755 at most.
func (w *diffWrites) runcMakes(h *tar.Header, p string) bool {
	if h.Uid != 0 || h.Gid != 0 || h.Mode&0o7777&^0o755 != 0 || hasXattrs(h) {
		return false
	}
	for _, r := range w.runc {
		switch {
		case h.Typeflag == tar.TypeDir && (r == p || strings.HasPrefix(r, p+"/")):
			return true
		case h.Typeflag == tar.TypeReg && h.Size == 0 && r == p:
			return true
		}
	}
	return false
}

// overwriteWhy says why the user could not have written regular file n in
// place to what h says ("" if it could): open(O_TRUNC) needs write access,
// or ownership (chmod first); the owner and mode stay unless changed as
// changeWhy allows.
func (w *diffWrites) overwriteWhy(h *tar.Header, n *node) string {
	if n.st.Uid != w.p.uid && !w.p.permits(&n.st, mayWrite) {
		return fmt.Sprintf("uid %d cannot write %s (%s)", w.p.uid, n.path, modeOwner(&n.st))
	}
	_, why := w.changeWhy(h, n)
	return why
}

// changeWhy says why the user could not have given existing file n the
// owner, mode and extended attributes of h, which the applier sets ("" if
// it could), and which of them.
func (w *diffWrites) changeWhy(h *tar.Header, n *node) (what, why string) {
	uid, gid, mode := uint32(h.Uid), uint32(h.Gid), uint32(h.Mode)&0o7777
	owns := n.st.Uid == w.p.uid
	chown := w.p.holds("CAP_CHOWN")
	switch {
	case uid != n.st.Uid && !chown:
		return "owner", fmt.Sprintf("uid %d cannot give %s (%s) to uid %d: chown needs CAP_CHOWN", w.p.uid, n.path, modeOwner(&n.st), uid)
	case gid != n.st.Gid && !chown && !(owns && w.p.groups[gid]):
		return "owner", fmt.Sprintf("uid %d cannot give %s (%s) to group %d: chgrp needs the owner and one of its groups, or CAP_CHOWN", w.p.uid, n.path, modeOwner(&n.st), gid)
	case mode != n.st.Mode&0o7777 && !owns:
		return "mode", fmt.Sprintf("uid %d cannot change %s (%s) to mode %#o: chmod needs the owner", w.p.uid, n.path, modeOwner(&n.st), mode)
	case hasXattrs(h) && !owns && (!w.p.permits(&n.st, mayWrite) || n.is(unix.S_IFDIR) && n.st.Mode&unix.S_ISVTX != 0):
		return "xattr", fmt.Sprintf("uid %d cannot set extended attributes of %s (%s)", w.p.uid, n.path, modeOwner(&n.st))
	}
	return "", ""
}

// newOwnerWhy says why the user could not have made a new file at p in
// parent with h's owner ("" if it could): it is the user's, in its group or
// parent's when parent is set-group-ID, then chgrp'd to one of its groups.
func (w *diffWrites) newOwnerWhy(h *tar.Header, parent *node, p string) string {
	if w.p.holds("CAP_CHOWN") {
		return ""
	}
	uid, gid := uint32(h.Uid), uint32(h.Gid)
	if uid != w.p.uid {
		return fmt.Sprintf("uid %d would own a new %s; owner %d needs CAP_CHOWN", w.p.uid, p, uid)
	}
	if !w.p.groups[gid] && (parent.st.Mode&unix.S_ISGID == 0 || gid != parent.st.Gid) {
		return fmt.Sprintf("uid %d cannot give a new %s group %d, not one of its groups (%s is %s)", w.p.uid, p, gid, parent.path, modeOwner(&parent.st))
	}
	return ""
}

// link decides hard link h's target: one fs.protected_hardlinks lets the
// user link (fs/namei.c, may_linkat), which then takes h's owner and mode.
func (w *diffWrites) link(h *tar.Header) (what, why string, err error) {
	dir, base := path.Split(path.Clean(h.Linkname))
	tdir, search, why, err := w.walkDir("/" + dir)
	if err != nil || why != "" || search != "" {
		return "link", why + search, err
	}
	t, err := w.lstat(path.Join(tdir.path, base))
	switch {
	case err != nil:
		return "", "", err
	case !t.exists:
		return "link", "nothing at " + t.path + " to link to", nil
	}
	safe := t.is(unix.S_IFREG) && t.st.Mode&unix.S_ISUID == 0 && t.st.Mode&(unix.S_ISGID|unix.S_IXGRP) != unix.S_ISGID|unix.S_IXGRP &&
		w.p.permits(&t.st, mayRead|mayWrite)
	if t.st.Uid != w.p.uid && !safe {
		return "link", fmt.Sprintf("uid %d cannot hard-link %s (%s): fs.protected_hardlinks needs its owner, or read and write access to a regular file", w.p.uid, t.path, modeOwner(&t.st)), nil
	}
	what, why = w.changeWhy(h, &t)
	return what, why, nil
}

// whiteout decides whiteout base of parent: .wh.<name> removes name,
// .wh..wh..opq everything in parent.
func (w *diffWrites) whiteout(parent node, base string) (string, error) {
	if base == whiteoutOpaque {
		why, err := w.emptyWhy(&parent)
		if why != "" {
			why = fmt.Sprintf("uid %d cannot empty %s: %s", w.p.uid, parent.path, why)
		}
		return why, err
	}
	gone, err := w.lstat(path.Join(parent.path, strings.TrimPrefix(base, whiteoutPrefix)))
	if err != nil || !gone.exists {
		return "", err
	}
	why, err := w.removeWhy(&parent, &gone)
	if why != "" {
		why = fmt.Sprintf("uid %d cannot remove %s: %s", w.p.uid, gone.path, why)
	}
	return why, err
}

// removeWhy says why the user could not remove n from directory dir (""
// if it could): unlink and rmdir need write on dir, and in a sticky dir the
// owner of n or of dir; a directory is emptied first.
func (w *diffWrites) removeWhy(dir, n *node) (string, error) {
	if !w.p.permits(&dir.st, mayWrite|mayExec) {
		return fmt.Sprintf("it cannot write %s (%s)", dir.path, modeOwner(&dir.st)), nil
	}
	if dir.st.Mode&unix.S_ISVTX != 0 && n.st.Uid != w.p.uid && dir.st.Uid != w.p.uid {
		return fmt.Sprintf("%s (%s) is sticky and uid %d owns neither it nor %s (%s)", dir.path, modeOwner(&dir.st), w.p.uid, n.path, modeOwner(&n.st)), nil
	}
	if n.is(unix.S_IFDIR) {
		return w.emptyWhy(n)
	}
	return "", nil
}

// emptyWhy says why the user could not remove every entry of directory dir
// ("" if it could), looking at no more files than the budget.
func (w *diffWrites) emptyWhy(dir *node) (string, error) {
	f, err := os.OpenFile(w.rootfs+dir.path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("rootfs %s: %w", dir.path, err)
	}
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		if errors.Is(err, io.EOF) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("rootfs %s: %w", dir.path, err)
		}
		for _, name := range names {
			if w.budget--; w.budget < 0 {
				return fmt.Sprintf("the diff's removals reach more than %d files", maxDiffEntries), nil
			}
			n, err := w.lstat(path.Join(dir.path, name))
			if err != nil {
				return "", err
			}
			if !n.exists {
				continue
			}
			if why, err := w.removeWhy(dir, &n); why != "" || err != nil {
				return why, err
			}
		}
	}
}

// hasXattrs reports whether h sets extended attributes.
func hasXattrs(h *tar.Header) bool {
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			return true
		}
	}
	return len(h.Xattrs) > 0 //nolint:staticcheck // Xattrs is deprecated, but a reader still fills it.
}
