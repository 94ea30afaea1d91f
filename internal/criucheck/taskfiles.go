package criucheck

import (
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	fsimg "github.com/checkpoint-restore/go-criu/v8/crit/images/fs"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
)

// remapGhostBit marks a ghost remap in images older than remap_type
// (criu/include/image.h, REMAP_GHOST; criu/files-reg.c, collect_one_remap).
const remapGhostBit = 1 << 31

// pidMaxLimit is the kernel's highest PID (include/linux/threads.h,
// PID_MAX_LIMIT on 64-bit).
const pidMaxLimit = 4 << 20

// remapTypeOf is the remap's type as CRIU reads it: remap_type, or for
// older images the ghost bit of remap_id, else a linked remap
// (criu/files-reg.c, collect_one_remap).
func remapTypeOf(e *remap.RemapFilePathEntry) remap.RemapType {
	if e.RemapType != nil {
		return e.GetRemapType()
	}
	if e.GetRemapId()&remapGhostBit != 0 {
		return remap.RemapType_GHOST
	}
	return remap.RemapType_LINKED
}

// checkTaskFiles checks what names files of files.img by ID for a task:
// its root, cwd and umask (fs-*.img) and the remaps of its files
// (remap-fpath.img).
func (c *checker) checkTaskFiles() error {
	regs := map[uint32]string{}
	const files = "files.img"
	if c.has("files", files) {
		err := eachEntry(c.dir, files, "FILES", func() *fdinfo.FileEntry { return new(fdinfo.FileEntry) }, func(f *fdinfo.FileEntry) error {
			if f.GetType() == fdinfo.FdTypes_REG {
				regs[f.GetId()] = f.GetReg().GetName()
			}
			return nil
		})
		if err != nil {
			return asRefusal(files, err)
		}
	}
	if err := c.checkFS(regs); err != nil {
		return err
	}
	return c.checkRemaps(regs)
}

// checkFS reads each task's root, cwd and umask (fs-<pid>.img; dumped by
// criu/cr-dump.c, dump_task_fs, from /proc/<pid>/root and cwd as regular
// files of files.img; restored by criu/files.c, prepare_fs_pid and
// restore_fs: fchroot into the root, fchdir into the cwd, umask). A live
// task must have one (restore_fs would open no root); the root is the
// container's root, "/" (the d_path of the task's root: the root of the
// container's mount namespace), unless the spec lets the container chroot
// itself (CAP_SYS_CHROOT), when it is any path the path rules allow; the
// umask has permission bits only.
func (c *checker) checkFS(regs map[uint32]string) error {
	seen := map[uint32]bool{}
	for _, name := range c.files["fs"] {
		pid, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, "fs-"), ".img"), 10, 32)
		if err != nil || !c.pids[uint32(pid)] {
			return refuse(name, "", "not the fs image of a process of pstree.img")
		}
		seen[uint32(pid)] = true
		var e fsimg.FsEntry
		if err := oneEntry(c.dir, name, "FS", &e); err != nil {
			return asRefusal(name, err)
		}
		root, ok := regs[e.GetRootId()]
		if !ok {
			return refuse(name, "root_id", "%d is not a regular file of files.img", e.GetRootId())
		}
		if root != "/" && !c.p.may("CAP_SYS_CHROOT") {
			return refuse(name, "root_id", "%q: a task's root is the container's root, /, unless the container may chroot (CAP_SYS_CHROOT)", root)
		}
		if _, ok := regs[e.GetCwdId()]; !ok {
			return refuse(name, "cwd_id", "%d is not a regular file of files.img", e.GetCwdId())
		}
		if e.GetUmask() > 0o777 {
			return refuse(name, "umask", "%#o has bits beyond the permission bits", e.GetUmask())
		}
	}
	for pid := range c.pids {
		if seen[pid] {
			continue
		}
		core, err := c.readCore(pid, "process")
		if err != nil {
			return err
		}
		if core.GetTc().GetTaskState() != taskDead {
			return refuse(pidImage("fs", pid), "", "missing for live process %d: the restore would have no root and cwd to give it", pid)
		}
	}
	return nil
}

// checkRemaps reads remap-fpath.img, the files the restore opens by
// another name than their own (criu/files-reg.c, collect_one_remap,
// open_path). A ghost remap (a deleted file, recreated from
// ghost-file-*.img beside its original path and unlinked once open; checked
// in checkGhosts) is allowed. A linked remap is refused: CRIU hard-links
// the file the remap names to the original path as root, may remount the
// original's mount read-write to do so (try_remount_writable), and unlinks
// the remap's own path after the restore (clean_one_remap), all past the
// container's permissions. A dump makes one only with --link-remap
// (criu/files-reg.c, create_link_remap), which runc passes only when asked
// (runc checkpoint.go, --link-remap) and containerd's runc shim never asks
// for (go-runc CheckpointOpts has no such option). A procfs remap (a file of /proc/<pid> of a dead
// process) makes CRIU fork a helper with that PID in the container's
// namespaces while the file is opened (collect_remap_dead_process): allowed
// when the original is on a proc mount of the spec at /proc/<that PID>, and
// the container has its own PID namespace.
func (c *checker) checkRemaps(regs map[uint32]string) error {
	const name = "remap-fpath.img"
	if !c.has("remap", name) {
		return nil
	}
	err := eachEntry(c.dir, name, "REMAP_FPATH", func() *remap.RemapFilePathEntry { return new(remap.RemapFilePathEntry) }, func(e *remap.RemapFilePathEntry) error {
		orig, ok := regs[e.GetOrigId()]
		if !ok {
			return refuse(name, "orig_id", "%d is not a regular file of files.img", e.GetOrigId())
		}
		switch t := remapTypeOf(e); t {
		case remap.RemapType_GHOST:
			return nil
		case remap.RemapType_PROCFS:
			pid := e.GetRemapId()
			if pid == 0 || pid > pidMaxLimit {
				return refuse(name, "remap_id", "%d is not a PID", pid)
			}
			if c.root[nsPid] == c.criuIDs[nsPid] {
				return refuse(name, "remap_type", "PROCFS: the restore would fork a helper with PID %d in the node's PID namespace", pid)
			}
			comps := splitPath(orig)
			i := mountAt(c.p.spec.Mounts, specDest(c.p.spec.Mounts), "/"+strings.Join(comps, "/"))
			if i < 0 || c.p.spec.Mounts[i].Type != "proc" {
				return refuse(name, "remap_type", "PROCFS for %q, which is not on a proc mount", orig)
			}
			rel := splitPath(strings.TrimPrefix("/"+strings.Join(comps, "/"), specDest(c.p.spec.Mounts)(i)))
			if len(rel) == 0 || rel[0] != strconv.FormatUint(uint64(pid), 10) {
				return refuse(name, "remap_id", "PROCFS remap %d for %q, which is not a file of that process", pid, orig)
			}
			return nil
		case remap.RemapType_LINKED:
			return refuse(name, "remap_type", "LINKED for %q: CRIU would hard-link another file to that path as root, remounting its mount writable, and unlink it afterwards", orig)
		default:
			return refuse(name, "remap_type", "%d is not a remap type CRIU restores", t)
		}
	})
	if err != nil {
		return asRefusal(name, err)
	}
	return nil
}
