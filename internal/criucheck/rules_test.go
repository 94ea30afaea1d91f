package criucheck

import (
	"slices"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fh"
	fsimg "github.com/checkpoint-restore/go-criu/v8/crit/images/fs"
	fsnotify "github.com/checkpoint-restore/go-criu/v8/crit/images/fsnotify"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	sk_opts "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-opts"
	skunix "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-unix"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timens"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/utsns"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// addFile appends f to files.img.
func addFile(f *fdinfo.FileEntry) func(*criutest.Images) {
	return func(im *criutest.Images) { im.Files = append(im.Files, f) }
}

// inotifyOn is an inotify file watching path.
func inotifyOn(id uint32, path string) *fdinfo.FileEntry {
	return &fdinfo.FileEntry{Type: fdinfo.FdTypes_INOTIFY.Enum(), Id: proto.Uint32(id),
		Ify: &fsnotify.InotifyFileEntry{Id: proto.Uint32(id), Flags: proto.Uint32(0), Fown: regFile(0, "/", 0).Reg.Fown,
			Wd: []*fsnotify.InotifyWdEntry{{Id: proto.Uint32(id), IIno: proto.Uint64(2), Mask: proto.Uint32(1), IgnoredMask: proto.Uint32(0),
				SDev: proto.Uint32(1), Wd: proto.Uint32(1), FHandle: &fh.FhEntry{Bytes: proto.Uint32(8), Type: proto.Uint32(1),
					Handle: make([]uint64, 16), Path: proto.String(path)}}}}}
}

// unixSocket is a unix socket bound to name (relative to nameDir when
// that is set).
func unixSocket(id uint32, name, nameDir string) *fdinfo.FileEntry {
	u := &skunix.UnixSkEntry{Id: proto.Uint32(id), Ino: proto.Uint32(id), Type: proto.Uint32(1), State: proto.Uint32(10),
		Flags: proto.Uint32(0), Uflags: proto.Uint32(0), Backlog: proto.Uint32(0), Peer: proto.Uint32(0),
		Fown: regFile(0, "/", 0).Reg.Fown, Opts: &sk_opts.SkOptsEntry{SoSndbuf: proto.Uint32(0), SoRcvbuf: proto.Uint32(0),
			SoSndTmoSec: proto.Uint64(0), SoSndTmoUsec: proto.Uint64(0), SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)},
		Name: []byte(name)}
	if nameDir != "" {
		u.NameDir = proto.String(nameDir)
	}
	return &fdinfo.FileEntry{Type: fdinfo.FdTypes_UNIXSK.Enum(), Id: proto.Uint32(id), Usk: u}
}

// The path rules (paths.go): lexical, in Check.
var pathCases = []checkCase{
	{name: "a file through /proc/self/fd", edit: addFile(regFile(5, "/proc/self/fd/3/etc/shadow", 0)), field: "reg.name"},
	{name: "a file through a process's root", edit: addFile(regFile(5, "/proc/1/root/etc/shadow", 0)), field: "reg.name"},
	{name: "a thread's cwd", edit: addFile(regFile(5, "/proc/1/task/1/cwd", 0)), field: "reg.name"},
	{name: "a file through thread-self's map_files", edit: addFile(regFile(5, "/proc/thread-self/map_files/400000-401000", 0)), field: "reg.name"},
	{name: "a namespace through /proc/<pid>/ns", edit: addFile(regFile(5, "/proc/1/ns/net", 0)), field: "reg.name"},
	{name: "a non-canonical path into /proc", edit: addFile(regFile(5, "/proc//self/./fd/3", 0)), field: "reg.name"},
	{name: "files of /proc a process opens", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/proc/1/fd", 0), regFile(6, "/proc/1/status", 0), regFile(7, "/proc/1/task/1/stat", 0),
			regFile(8, "/proc/sys/kernel/hostname", 0), regFile(9, "/proc/1/fdinfo/3", 0))
	}},
	{name: "a relative file name", edit: addFile(regFile(5, "xproc/self/fd/3", 0)), field: "reg.name"},
	{name: "an inotify watch through /proc/self/root", edit: addFile(inotifyOn(7, "/proc/self/root/etc")), field: "ify.wd.f_handle.path"},
	{name: "an inotify watch of a directory", edit: addFile(inotifyOn(7, "/etc"))},
	{name: "a unix socket bound through /proc/self/fd", edit: addFile(unixSocket(8, "/proc/self/fd/9/x.sock", "")), field: "usk.name"},
	{name: "a unix socket bound relative to a cwd through /proc", edit: addFile(unixSocket(8, "x.sock", "/proc/1/cwd")), field: "usk.name"},
	{name: "a unix socket bound relative to a relative name_dir", edit: addFile(unixSocket(8, "x.sock", "tmp")), field: "usk.name"},
	{name: "a unix socket bound in /tmp, and an abstract one", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, unixSocket(8, "/tmp/app.sock", ""), unixSocket(9, "app.sock", "/run"), unixSocket(10, "\x00abstract", ""))
	}},
}

// setFS edits the root task's fs image.
func setFS(edit func(*fsimg.FsEntry)) func(*criutest.Images) {
	return func(im *criutest.Images) { edit(im.FS[1]) }
}

// fsFile adds file 5 at path and makes it the root task's root (root) or
// cwd.
func fsFile(root bool, path string) func(*criutest.Images) {
	return func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, path, 0))
		if root {
			im.FS[1].RootId = proto.Uint32(5)
		} else {
			im.FS[1].CwdId = proto.Uint32(5)
		}
	}
}

func withoutCaps(drop ...string) func(*specs.Spec) {
	return func(s *specs.Spec) {
		c := s.Process.Capabilities
		del := func(l []string) []string {
			return slices.DeleteFunc(slices.Clone(l), func(n string) bool { return slices.Contains(drop, n) })
		}
		c.Bounding, c.Effective, c.Permitted = del(c.Bounding), del(c.Effective), del(c.Permitted)
	}
}

func withCaps(add ...string) func(*specs.Spec) {
	return func(s *specs.Spec) {
		c := s.Process.Capabilities
		c.Bounding, c.Effective, c.Permitted = append(c.Bounding, add...), append(c.Effective, add...), append(c.Permitted, add...)
	}
}

func addRemap(e *remap.RemapFilePathEntry) func(*criutest.Images) {
	return func(im *criutest.Images) {
		b, err := criutest.Encode("REMAP_FPATH", e)
		if err != nil {
			panic(err)
		}
		im.Raw["remap-fpath.img"] = b
	}
}

// mmWith is mm-1.img with one area from start to end.
func mmWith(start, end uint64) func(*criutest.Images) {
	return func(im *criutest.Images) {
		z := proto.Uint64(0)
		b, err := criutest.Encode("MM", &mm.MmEntry{MmStartCode: z, MmEndCode: z, MmStartData: z, MmEndData: z, MmStartStack: z,
			MmStartBrk: z, MmBrk: z, MmArgStart: z, MmArgEnd: z, MmEnvStart: z, MmEnvEnd: z, ExeFileId: proto.Uint32(criutest.RootFileID),
			Vmas: []*vma.VmaEntry{{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: z, Shmid: z, Prot: proto.Uint32(3),
				Flags: proto.Uint32(0x22), Status: proto.Uint32(1 << 1), Fd: proto.Int64(-1)}}})
		if err != nil {
			panic(err)
		}
		im.Raw["mm-1.img"] = b
	}
}

// The files a task names by ID (taskfiles.go) and its memory (memory.go).
var taskFileCases = []checkCase{
	{name: "a live task without fs image", edit: func(im *criutest.Images) { delete(im.FS, 1) }, field: "fs-1.img"},
	{name: "an fs image of no process", edit: func(im *criutest.Images) { im.FS[9] = im.FS[1] }, field: "fs-9.img"},
	{name: "a root naming no file", edit: setFS(func(e *fsimg.FsEntry) { e.RootId = proto.Uint32(77) }), field: "root_id"},
	{name: "a cwd naming no file", edit: setFS(func(e *fsimg.FsEntry) { e.CwdId = proto.Uint32(77) }), field: "cwd_id"},
	{name: "a root that is not a regular file", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_PIPE.Enum(), Id: proto.Uint32(77)})
		im.FS[1].RootId = proto.Uint32(77)
	}, field: "root_id"},
	{name: "a root elsewhere without CAP_SYS_CHROOT", spec: withoutCaps("CAP_SYS_CHROOT"), edit: fsFile(true, "/var/empty"), field: "root_id"},
	{name: "a root elsewhere with CAP_SYS_CHROOT", edit: fsFile(true, "/var/empty")},
	{name: "a cwd through /proc", edit: fsFile(false, "/proc/self/cwd"), field: "reg.name"},
	{name: "a cwd in the container", edit: fsFile(false, "/srv/app")},
	{name: "a umask beyond the permission bits", edit: setFS(func(e *fsimg.FsEntry) { e.Umask = proto.Uint32(0o7022) }), field: "umask"},
	{name: "a linked remap", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/etc/passwd", 0), regFile(6, "/tmp/link_remap.6", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(6), RemapType: remap.RemapType_LINKED.Enum()})(im)
	}, field: "remap_type"},
	{name: "a remap without type read as linked", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/etc/passwd", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(6)})(im)
	}, field: "remap_type"},
	{name: "a ghost remap, and one of images without type", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/tmp/deleted", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(6), RemapType: remap.RemapType_GHOST.Enum()})(im)
	}},
	{name: "a ghost remap by the old bit", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/tmp/deleted", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(6 | remapGhostBit)})(im)
	}},
	{name: "a remap of an unknown type", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/tmp/deleted", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(6), RemapType: remap.RemapType(7).Enum()})(im)
	}, field: "remap_type"},
	{name: "a remap of no file", edit: addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(55), RemapId: proto.Uint32(6), RemapType: remap.RemapType_GHOST.Enum()}),
		field: "orig_id"},
	{name: "a procfs remap of a dead process's file", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/proc/42/status", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(42), RemapType: remap.RemapType_PROCFS.Enum()})(im)
	}},
	{name: "a procfs remap of another process's PID", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/proc/42/status", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(43), RemapType: remap.RemapType_PROCFS.Enum()})(im)
	}, field: "remap_id"},
	{name: "a procfs remap of a file not on proc", edit: func(im *criutest.Images) {
		im.Files = append(im.Files, regFile(5, "/tmp/42", 0))
		addRemap(&remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(42), RemapType: remap.RemapType_PROCFS.Enum()})(im)
	}, field: "remap_type"},
	{name: "memory at address 0", edit: mmWith(0, 4096), field: "vmas[0].start"},
	{name: "memory below mmap_min_addr", edit: mmWith(0x1000, 0x11000), field: "vmas[0].start"},
	{name: "memory at address 0 with CAP_SYS_RAWIO", spec: withCaps("CAP_SYS_RAWIO"), edit: mmWith(0, 4096)},
	{name: "memory at an ordinary address", edit: mmWith(0x400000, 0x401000)},
	{name: "memory ending before it starts", edit: mmWith(0x401000, 0x400000), field: "vmas[0].start"},
}

func setUTS(node, domain string) func(*criutest.Images) {
	return func(im *criutest.Images) {
		im.UTS = &utsns.UtsnsEntry{Nodename: proto.String(node), Domainname: proto.String(domain)}
	}
}

func clocks(mSec, mNsec, bSec, bNsec uint64) func(*criutest.Images) {
	return func(im *criutest.Images) {
		im.Timens = &timens.TimensEntry{Monotonic: &timens.Timespec{TvSec: proto.Uint64(mSec), TvNsec: proto.Uint64(mNsec)},
			Boottime: &timens.Timespec{TvSec: proto.Uint64(bSec), TvNsec: proto.Uint64(bNsec)}}
	}
}

// The namespaces' images (nsimages.go).
var namespaceCases = []checkCase{
	{name: "the host name of a pod of another name", edit: setUTS("web-7f9c6d-x2x", "(none)")},
	{name: "a host name with a newline", edit: setUTS("pod\nroot", "(none)"), field: "nodename"},
	{name: "a host name longer than the kernel's", edit: setUTS(string(make([]byte, 65)), "(none)"), field: "nodename"},
	{name: "a domain name with a blank", edit: setUTS("pod-a", "evil domain"), field: "domainname"},
	{name: "a host name other than the spec's", spec: func(s *specs.Spec) { s.Hostname = "pod-a" }, edit: setUTS("pod-b", "(none)"), field: "nodename"},
	{name: "a UTS image of another namespace", edit: func(im *criutest.Images) { im.Raw["utsns-7.img"] = im.Raw["pages-1.img"] }, field: "utsns-7.img"},
	{name: "a UTS image where the container has the node's namespace", spec: func(s *specs.Spec) {
		s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.UTSNamespace })
	}, edit: func(im *criutest.Images) {
		b, _ := criutest.Encode("UTSNS", &utsns.UtsnsEntry{Nodename: proto.String("x"), Domainname: proto.String("(none)")})
		im.Raw["utsns-1.img"] = b
	}, field: "utsns-1.img"},
	{name: "namespace images named by PID", edit: func(im *criutest.Images) { im.Inventory.NsPerId = nil }, field: "ns_per_id"},
	{name: "an IPC limit raised", edit: func(im *criutest.Images) { im.IPCVar.MsgCtlmnb = proto.Uint32(1 << 30) }, field: "msg_ctlmnb"},
	{name: "an IPC limit raised as the spec's sysctl says", spec: func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.msgmnb": "65536"} },
		edit: func(im *criutest.Images) { im.IPCVar.MsgCtlmnb = proto.Uint32(65536) }},
	{name: "a POSIX queue limit raised", edit: func(im *criutest.Images) { im.IPCVar.MqMsgsizeMax = proto.Uint32(1 << 24) }, field: "mq_msgsize_max"},
	{name: "semaphore limits raised", edit: func(im *criutest.Images) { im.IPCVar.SemCtls = []uint32{32000, 1024000000, 500, 1 << 30} }, field: "sem_ctls"},
	{name: "semaphore limits of three values", edit: func(im *criutest.Images) { im.IPCVar.SemCtls = []uint32{250, 32000, 32} }, field: "sem_ctls"},
	{name: "IPC limits lowered, removal forced", edit: func(im *criutest.Images) {
		im.IPCVar.ShmCtlmax = proto.Uint64(1 << 20)
		im.IPCVar.SemCtls = []uint32{250, 32000, 32, 128}
		im.IPCVar.ShmRmidForced = proto.Uint32(1)
		im.IPCVar.ShmNextId = proto.Uint32(7)
	}},
	{name: "an IPC object image of another namespace", edit: func(im *criutest.Images) { im.Raw["ipcns-shm-5.img"] = nil }, field: "ipcns-shm-5.img"},
	{name: "clocks with a nanosecond count of a second", edit: clocks(100, 1e9, 100, 0), field: "monotonic"},
	{name: "clocks of a node up for two centuries", edit: clocks(100, 0, 200*366*86400, 0), field: "boottime"},
	{name: "boottime below monotonic", edit: clocks(100, 5, 100, 4), field: "boottime"},
	{name: "clocks of a node up for a year", edit: clocks(365*86400, 999999999, 366*86400, 0)},
	{name: "a time namespace image the restore does not read", edit: func(im *criutest.Images) {
		im.Raw["timens-5.img"] = im.Raw["pages-1.img"]
	}, field: "timens-5.img"},
}
