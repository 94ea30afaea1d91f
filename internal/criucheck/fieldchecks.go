package criucheck

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/eventpoll"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	ipcmsg "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-msg"
	ipcsem "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-sem"
	ipcshm "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-shm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/memfd"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	pipedata "github.com/checkpoint-restore/go-criu/v8/crit/images/pipe-data"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	sknetlink "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-netlink"
	skopts "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-opts"
	skpacket "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-packet"
	tcpstream "github.com/checkpoint-restore/go-criu/v8/crit/images/tcp-stream"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timerfd"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/tty"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// checkFieldRules applies the rules fields.go gives fields no other check
// reads: they bound what CRIU does as root with a value the container's own
// processes could not have set.
func (c *checker) checkFieldRules() error {
	for _, step := range []func() error{
		c.checkInventoryFields,
		c.checkFileFields,
		c.checkTaskTimers,
		c.checkTTYDevices,
		c.checkFdinfo,
		c.checkMountOptions,
		c.checkMemfds,
		c.checkPipeData,
		c.checkSkQueues,
		c.checkTCPStreams,
		c.checkTTYData,
		c.checkIPCObjects,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// eachImageOf calls fn with the name of each image file of kind; an error
// is made a refusal of that image.
func (c *checker) eachImageOf(kind string, fn func(name string) error) error {
	for _, name := range c.files[kind] {
		if err := fn(name); err != nil {
			return asRefusal(name, err)
		}
	}
	return nil
}

// runIDRE is a UUID as uuid_unparse writes it: CRIU's run ID (criu/util.c,
// util_init).
var runIDRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// checkInventoryFields: the dump's CRIU run ID names the nftables table the
// restore deletes, in a command CRIU builds from it ("delete table inet
// CRIU-<id>", criu/netfilter.c nftables_get_table, criu/net.c
// nftables_network_unlock), in the namespace CRIU runs in when the
// container's network namespace is joined: anything but a UUID could be
// another nft command. The root cgroup set is CRIU's own at the dump, which
// CRIU does not dump (criu/cgroup.c, dump_sets): a root task in it would
// keep CRIU's cgroup namespace (prepare_cgroup_namespace) whatever the
// namespace IDs say.
func (c *checker) checkInventoryFields() error {
	const name = "inventory.img"
	var inv inventory.InventoryEntry
	if err := oneEntry(c.dir, name, "INVENTORY", &inv); err != nil {
		return asRefusal(name, err)
	}
	if inv.DumpCriuRunId != nil && !runIDRE.MatchString(inv.GetDumpCriuRunId()) {
		return refuse(name, "dump_criu_run_id", "%q is not a UUID as CRIU writes it; CRIU puts it in an nftables command", inv.GetDumpCriuRunId())
	}
	if inv.RootCgSet == nil || !c.has("cgroup", "cgroup.img") {
		return nil
	}
	var e cgroup.CgroupEntry
	if err := oneEntry(c.dir, "cgroup.img", "CGROUP", &e); err != nil {
		return asRefusal("cgroup.img", err)
	}
	for _, s := range e.GetSets() {
		if s.GetId() == inv.GetRootCgSet() {
			return refuse(name, "root_cg_set", "%d is a set of cgroup.img; CRIU's own set is never dumped, and a task in it would keep the restoring CRIU's cgroup namespace", s.GetId())
		}
	}
	return nil
}

// treeTasks are the PIDs, thread IDs and so group IDs of pstree.img: what a
// file's owner may name.
func (c *checker) treeTasks() (map[uint32]bool, error) {
	const name = "pstree.img"
	out := map[uint32]bool{}
	err := eachEntry(c.dir, name, "PSTREE", func() *pstree.PstreeEntry { return new(pstree.PstreeEntry) }, func(e *pstree.PstreeEntry) error {
		out[e.GetPid()] = true
		for _, t := range e.GetThreads() {
			out[t] = true
		}
		return nil
	})
	if err != nil {
		return nil, asRefusal(name, err)
	}
	return out, nil
}

// epollWakeup is EPOLLWAKEUP (include/uapi/linux/eventpoll.h).
const epollWakeup = 1 << 29

// checkFileFields checks what every file of files.img may carry, whatever
// its kind, and what the kinds files.go leaves to it.
//
// An owner (fown_entry, F_SETOWN_EX): CRIU takes the owner's uid and euid
// with setresuid as root before it sets the owner (criu/files.c,
// restore_fown), and the kernel lets SIGIO reach any process of the PID
// namespace for an owner whose euid is root (fs/fcntl.c, sigio_perm). An
// owner is a task of the tree, with the uids the container's processes may
// have (creds.go mayChangeIDs). A file without an owner (pid 0) is left alone.
//
// Socket options (sk_opts_entry) of every kind of socket are set as root
// (criu/sockets.c, restore_socket_opts): SO_MARK and a high SO_PRIORITY need
// CAP_NET_ADMIN (checkSockOpts). A socket or tun file is created in the
// network namespace its ns_id names (criu/namespaces.c, switch_ns_by_id):
// the container's. A netlink socket connected to a multicast group sends to
// it without a check at send (net/netlink/af_netlink.c): connecting needs
// CAP_NET_ADMIN. An epoll watch with EPOLLWAKEUP needs CAP_BLOCK_SUSPEND,
// which epoll_ctl drops silently for a process without it, not for CRIU.
func (c *checker) checkFileFields() error {
	if len(c.files["files"])+len(c.files["timerfd"]) == 0 {
		return nil
	}
	tasks, err := c.treeTasks()
	if err != nil {
		return err
	}
	// timerfd.img holds the timerfds of images older than files.img (CRIU
	// reads it only where files.img is missing, criu/cr-restore.c
	// cinfos_files), with the same rules.
	err = c.eachImageOf("timerfd", func(name string) error {
		return eachEntry(c.dir, name, "TIMERFD", func() *timerfd.TimerfdEntry { return new(timerfd.TimerfdEntry) }, func(t *timerfd.TimerfdEntry) error {
			return c.checkNested(name, "timerfd "+itoa(t.GetId())+" ", t, tasks)
		})
	})
	if err != nil {
		return err
	}
	return c.eachImageOf("files", func(name string) error {
		return eachEntry(c.dir, name, "FILES", func() *fdinfo.FileEntry { return new(fdinfo.FileEntry) }, func(f *fdinfo.FileEntry) error {
			prefix := "file " + itoa(f.GetId()) + " " + f.GetType().String() + " "
			var ns *uint32
			switch {
			case f.GetIsk() != nil:
				ns = f.GetIsk().NsId
			case f.GetUsk() != nil:
				ns = f.GetUsk().NsId
			case f.GetPsk() != nil:
				ns = f.GetPsk().NsId
			case f.GetNlsk() != nil:
				ns = f.GetNlsk().NsId
			case f.GetTunf() != nil:
				ns = f.GetTunf().NsId
			}
			if ns != nil && *ns != c.root[1] {
				return refuse(name, prefix+"ns_id", "%d, not the container's network namespace (%d): the restore would create the socket in another", *ns, c.root[1])
			}
			return c.checkNested(name, prefix, f, tasks)
		})
	})
}

// checkNested checks the messages in m that a file of any kind may carry
// (owners, socket options, netlink peers, epoll watches, timerfds); a
// refusal names the field by prefix and the path to it.
func (c *checker) checkNested(image, prefix string, m proto.Message, tasks map[uint32]bool) error {
	return eachMessage(m.ProtoReflect(), "", func(path string, msg protoreflect.Message) error {
		field := prefix + path
		if path != "" {
			field += "."
		}
		switch v := msg.Interface().(type) {
		case *fown.FownEntry:
			return c.checkFown(image, field, v, tasks)
		case *skopts.SkOptsEntry:
			return c.checkSockOpts(image, strings.TrimSuffix(field, "."), v.GetSoMark(), v.GetSoPriority())
		case *sknetlink.NetlinkSkEntry:
			if v.GetDstGroup() != 0 && !c.p.may("CAP_NET_ADMIN") {
				return refuse(image, field+"dst_group", "%d: a socket connected to a multicast group sends to it; it needs CAP_NET_ADMIN", v.GetDstGroup())
			}
		case *eventpoll.EventpollTfdEntry:
			if v.GetEvents()&epollWakeup != 0 && !c.p.may("CAP_BLOCK_SUSPEND") {
				return refuse(image, field+"events", "EPOLLWAKEUP; it needs CAP_BLOCK_SUSPEND")
			}
		case *timerfd.TimerfdEntry:
			if ck := v.GetClockid(); (ck == unix.CLOCK_REALTIME_ALARM || ck == unix.CLOCK_BOOTTIME_ALARM) && !c.p.may("CAP_WAKE_ALARM") {
				return refuse(image, field+"clockid", "an alarm clock; it needs CAP_WAKE_ALARM")
			}
		}
		return nil
	})
}

func (c *checker) checkFown(image, field string, f *fown.FownEntry, tasks map[uint32]bool) error {
	if f.GetPid() == 0 {
		return nil
	}
	if !tasks[f.GetPid()] {
		return refuse(image, field+"pid", "%d is not a process, thread or group of the checkpoint", f.GetPid())
	}
	for _, u := range []struct {
		field string
		v     uint32
	}{{"uid", f.GetUid()}, {"euid", f.GetEuid()}} {
		if u.v != c.p.uid && !c.mayChangeIDs("CAP_SETUID") {
			return refuse(image, field+u.field, "%d, the container runs as %d and may not change it; the restore sets the owner with that uid as root", u.v, c.p.uid)
		}
	}
	return nil
}

// eachMessage calls fn with m and every message in it, depth first, with
// the path of fields to it ("" for m).
func eachMessage(m protoreflect.Message, path string, fn func(string, protoreflect.Message) error) error {
	if err := fn(path, m); err != nil {
		return err
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil || fd.IsMap() {
			return true
		}
		p := string(fd.Name())
		if path != "" {
			p = path + "." + p
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = eachMessage(l.Get(i).Message(), p, fn)
			}
		} else {
			err = eachMessage(v.Message(), p, fn)
		}
		return err == nil
	})
	return err
}

// checkTaskTimers: the restorer creates a task's POSIX timers before it
// drops to the task's credentials (criu/pie/restorer.c, create_posix_timers
// before restore_creds), so an alarm clock, which timer_create allows only
// with CAP_WAKE_ALARM, needs it in the spec.
func (c *checker) checkTaskTimers() error {
	if c.p.may("CAP_WAKE_ALARM") {
		return nil
	}
	for pid := range c.pids {
		core, err := c.readCore(pid, "process")
		if err != nil {
			return err
		}
		for i, t := range core.GetTc().GetTimers().GetPosix() {
			if ck := t.GetClockId(); ck == unix.CLOCK_REALTIME_ALARM || ck == unix.CLOCK_BOOTTIME_ALARM {
				return refuse(pidImage("core", pid), "tc.timers.posix["+itoa(i)+"].clock_id", "an alarm clock; it needs CAP_WAKE_ALARM")
			}
		}
	}
	return nil
}

// Terminal devices (include/uapi/linux/major.h; Documentation/admin-guide/devices.txt).
const (
	ttyAuxMajor      = 5
	ptySlaveMajor    = 136
	ptySlaveMajorEnd = 136 + 8
)

// checkTTYDevices: CRIU picks a terminal's driver, and so how it opens it,
// by its device numbers, not its type (criu/tty.c, get_tty_driver); the
// type is what checkFiles checks. The numbers must be the type's: a
// pseudo-terminal's master (/dev/ptmx) or slave, the controlling terminal
// (/dev/tty), the console (/dev/console).
func (c *checker) checkTTYDevices() error {
	return c.eachImageOf("tty", func(name string) error {
		return eachEntry(c.dir, name, "TTY_INFO", func() *tty.TtyInfoEntry { return new(tty.TtyInfoEntry) }, func(t *tty.TtyInfoEntry) error {
			major, minor := unix.Major(uint64(t.GetRdev())), unix.Minor(uint64(t.GetRdev()))
			ok := true
			switch t.GetType() {
			case tty.TtyType_PTY:
				ok = major == ttyAuxMajor && minor == 2 || major >= ptySlaveMajor && major < ptySlaveMajorEnd
			case tty.TtyType_CTTY:
				ok = major == ttyAuxMajor && minor == 0
			case tty.TtyType_CONSOLE:
				ok = major == ttyAuxMajor && minor == 1
			}
			if !ok {
				return refuse(name, "tty "+itoa(t.GetId())+" rdev", "%d:%d is not a device of a %v terminal", major, minor, t.GetType())
			}
			return nil
		})
	})
}

// checkFdinfo reads the tasks' descriptor tables (fdinfo-*.img). An inet
// socket's SELinux context is the one CRIU creates it with on an SELinux
// node (criu/sk-inet.c, run_setsockcreatecon): the container's own label,
// as its processes create their sockets.
func (c *checker) checkFdinfo() error {
	return c.eachImageOf("fdinfo", func(name string) error {
		return eachEntry(c.dir, name, "FDINFO", func() *fdinfo.FdinfoEntry { return new(fdinfo.FdinfoEntry) }, func(e *fdinfo.FdinfoEntry) error {
			if ctx := e.GetXattrSecuritySelinux(); ctx != "" && ctx != c.p.spec.Process.SelinuxLabel {
				return refuse(name, "fd "+itoa(e.GetFd())+" xattr_security_selinux", "%q is not the container's SELinux label", ctx)
			}
			return nil
		})
	})
}

// cgroupV1Options are the options of a cgroup v1 mount beside its
// controllers (kernel/cgroup/cgroup-v1.c, cgroup1_parse_param), without
// release_agent; cgroupV2Options those of the unified hierarchy
// (kernel/cgroup/cgroup.c, cgroup2_parse_param).
var (
	cgroupV1Options = map[string]bool{"none": true, "xattr": true, "noprefix": true, "clone_children": true,
		"cpuset_v2_mode": true, "favordynmods": true, "rw": true, "ro": true}
	cgroupV2Options = map[string]bool{"nsdelegate": true, "favordynmods": true, "memory_localevents": true,
		"memory_recursiveprot": true, "memory_hugetlb_accounting": true, "pids_localevents": true, "rw": true, "ro": true}
)

// checkMountOptions: CRIU passes a fresh mount's options to mount(2) as
// they are in the image (criu/mount.c, do_simple_mount). A cgroup v1 mount
// that creates a hierarchy takes its release agent from them, a program the
// kernel runs as root on the node when a cgroup of it empties: a cgroup
// mount's options are its controllers (cgroup.go's names) and the flags
// above. The options of proc, sysfs, tmpfs, devpts and mqueue apply to the
// new superblock alone and are not read here; mounts.go decides which fresh
// mounts there are.
func (c *checker) checkMountOptions() error {
	return c.eachImageOf("mounts", func(name string) error {
		return eachEntry(c.dir, name, "MNTS", func() *mnt.MntEntry { return new(mnt.MntEntry) }, func(m *mnt.MntEntry) error {
			t := mnt.Fstype(m.GetFstype())
			if t != mnt.Fstype_CGROUP && t != mnt.Fstype_CGROUP2 {
				return nil
			}
			for _, o := range strings.Split(m.GetOptions(), ",") {
				switch {
				case o == "":
				case t == mnt.Fstype_CGROUP2 && cgroupV2Options[o]:
				case t == mnt.Fstype_CGROUP && (cgroupV1Options[o] || cgroupV1Controllers[o]):
				case strings.HasPrefix(o, "release_agent="):
					return refuse(name, "mountpoint "+mountpointOf(m)+" options", "%q: a program the kernel would run as root on the node when a cgroup of a new hierarchy empties", o)
				default:
					return refuse(name, "mountpoint "+mountpointOf(m)+" options", "%q is not an option of a container's %v mount; CRIU would mount with it as root", o, t)
				}
			}
			return nil
		})
	})
}

// checkMemfds reads memfd.img, the memfds' inodes: CRIU creates each and
// sets its owner and mode as root (criu/memfd.c), and a memfd is executable
// through /proc/self/fd, so a set-ID bit would make a set-ID program of an
// owner of the image's choosing.
func (c *checker) checkMemfds() error {
	return c.eachImageOf("memfd", func(name string) error {
		return eachEntry(c.dir, name, "MEMFD_INODE", func() *memfd.MemfdInodeEntry { return new(memfd.MemfdInodeEntry) }, func(e *memfd.MemfdInodeEntry) error {
			if e.GetMode()&(unix.S_ISUID|unix.S_ISGID) != 0 {
				return refuse(name, "memfd "+itoa(uint32(e.GetInodeId()))+" mode", "%#o is set-user-ID or set-group-ID", e.GetMode())
			}
			return nil
		})
	})
}

// pipeMaxSize is the node's fs.pipe-max-size, read once: the largest pipe
// buffer a process sets without CAP_SYS_RESOURCE (fs/pipe.c,
// pipe_set_size). 1 MiB, the kernel's default, when it cannot be read.
// Tests replace it.
var pipeMaxSize = sync.OnceValue(func() uint64 { return readSysctl("/proc/sys/fs/pipe-max-size", 1<<20) })

func readSysctl(path string, dflt uint64) uint64 {
	b, err := os.ReadFile(path)
	if err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return v
		}
	}
	return dflt
}

// checkPipeData reads the pipes' and FIFOs' contents (pipes-data.img,
// fifo-data.img): CRIU sets each pipe's size as root (criu/pipes.c,
// restore_pipe_data: F_SETPIPE_SZ), which beyond fs.pipe-max-size needs
// CAP_SYS_RESOURCE.
func (c *checker) checkPipeData() error {
	return c.eachImageOf("pipedata", func(name string) error {
		want := "PIPES_DATA"
		if strings.HasPrefix(name, "fifo") {
			want = "FIFO_DATA"
		}
		return eachDataEntry(c.dir, name, want, func() *pipedata.PipeDataEntry { return new(pipedata.PipeDataEntry) }, func(e *pipedata.PipeDataEntry, _ *dataImage) (int64, error) {
			if e.Size != nil && uint64(e.GetSize()) > pipeMaxSize() && !c.p.may("CAP_SYS_RESOURCE") {
				return 0, refuse(name, "pipe "+itoa(e.GetPipeId())+" size", "%d is above the node's fs.pipe-max-size %d; it needs CAP_SYS_RESOURCE", e.GetSize(), pipeMaxSize())
			}
			return int64(e.GetBytes()), nil
		})
	})
}

// checkSkQueues reads the packets queued on the tree's sockets
// (sk-queues.img): the entries are decoded and their fields walked; the
// packets are the processes' own data.
func (c *checker) checkSkQueues() error {
	return c.eachImageOf("skqueues", func(name string) error {
		return eachDataEntry(c.dir, name, "SK_QUEUES", func() *skpacket.SkPacketEntry { return new(skpacket.SkPacketEntry) }, func(e *skpacket.SkPacketEntry, _ *dataImage) (int64, error) {
			return int64(e.GetLength()), nil
		})
	})
}

// checkTCPStreams reads a connected TCP socket's state (tcp-stream-*.img,
// one entry, then its queues): decoded and walked.
func (c *checker) checkTCPStreams() error {
	return c.eachImageOf("tcpstream", func(name string) error {
		return firstEntryOf(c.dir, name, "TCP_STREAM", new(tcpstream.TcpStreamEntry))
	})
}

// firstEntryOf decodes the first entry of the data image dir/name.
func firstEntryOf(dir, name, want string, m proto.Message) error {
	d, err := openDataImage(dir, name, want)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.next(m)
}

// checkTTYData reads what was queued on the tree's terminals
// (tty-data.img): decoded and walked.
func (c *checker) checkTTYData() error {
	return c.eachImageOf("ttydata", func(name string) error {
		return eachEntry(c.dir, name, "TTY_DATA", func() *tty.TtyDataEntry { return new(tty.TtyDataEntry) }, func(*tty.TtyDataEntry) error { return nil })
	})
}

// ipcModeBits are what an IPC object's mode may hold: permissions, and the
// status bits SHM_DEST and SHM_LOCKED a segment's mode shows, which CRIU
// passes to shmget where they are IPC_CREAT and IPC_EXCL (criu/ipc_ns.c,
// prepare_ipc_shm_seg). Any other bit is a flag of shmget: SHM_HUGETLB,
// SHM_NORESERVE.
const ipcModeBits = 0o777 | 0o1000 | 0o2000

// hugetlbShmGroup is the node's vm.hugetlb_shm_group, read once: the group
// that may create huge-page segments without CAP_IPC_LOCK
// (mm/hugetlb.c via ipc/shm.c, can_do_hugetlb_shm).
var hugetlbShmGroup = sync.OnceValue(func() uint64 { return readSysctl("/proc/sys/vm/hugetlb_shm_group", 0) })

// checkIPCObjects reads the objects the restore creates in the pod's IPC
// namespace (ipcns-shm-, -msg-, -sem-*.img; criu/ipc_ns.c): each mode holds
// permission and status bits only, and a huge-page segment needs
// CAP_IPC_LOCK or the node's vm.hugetlb_shm_group. Sizes are bounded by the
// namespace's limits, which the kernel applies to root too; contents are
// the processes' own.
func (c *checker) checkIPCObjects() error {
	mode := func(name, field string, m uint32) error {
		if m&^ipcModeBits != 0 {
			return refuse(name, field+" mode", "%#o has bits beyond permissions; CRIU passes them to shmget/msgget/semget as flags", m)
		}
		return nil
	}
	return c.eachImageOf("ipcobj", func(name string) error {
		switch {
		case strings.HasPrefix(name, "ipcns-shm-pages-"):
			// No CRIU reads such an image.
		case strings.HasPrefix(name, "ipcns-shm-"):
			return eachDataEntry(c.dir, name, "IPCNS_SHM", func() *ipcshm.IpcShmEntry { return new(ipcshm.IpcShmEntry) }, func(e *ipcshm.IpcShmEntry, _ *dataImage) (int64, error) {
				field := "shm " + itoa(e.GetDesc().GetId())
				if err := mode(name, field, e.GetDesc().GetMode()); err != nil {
					return 0, err
				}
				if e.GetHugetlbFlag() != 0 && !c.p.may("CAP_IPC_LOCK") && !c.p.groups[uint32(hugetlbShmGroup())] {
					return 0, refuse(name, field+" hugetlb_flag", "a huge-page segment; it needs CAP_IPC_LOCK or the node's vm.hugetlb_shm_group")
				}
				if e.GetInPagemaps() {
					return 0, nil
				}
				return (int64(e.GetSize()) + 3) &^ 3, nil
			})
		case strings.HasPrefix(name, "ipcns-msg-"):
			return eachDataEntry(c.dir, name, "IPCNS_MSG", func() *ipcmsg.IpcMsgEntry { return new(ipcmsg.IpcMsgEntry) }, func(e *ipcmsg.IpcMsgEntry, d *dataImage) (int64, error) {
				field := "msg " + itoa(e.GetDesc().GetId())
				if err := mode(name, field, e.GetDesc().GetMode()); err != nil {
					return 0, err
				}
				// The queue's messages follow, each an entry and its
				// text (criu/ipc_ns.c, prepare_ipc_msg_queue_messages).
				for i := uint32(0); i < e.GetQnum(); i++ {
					var m ipcmsg.IpcMsg
					if err := d.next(&m); err != nil {
						return 0, err
					}
					if m.GetMsize() > maxIPCMsg {
						return 0, refuse(name, field+" msize", "%d is above MSGMAX %d", m.GetMsize(), maxIPCMsg)
					}
					if err := d.skip((int64(m.GetMsize()) + 7) &^ 7); err != nil {
						return 0, err
					}
				}
				return 0, nil
			})
		case strings.HasPrefix(name, "ipcns-sem-"):
			return eachDataEntry(c.dir, name, "IPCNS_SEM", func() *ipcsem.IpcSemEntry { return new(ipcsem.IpcSemEntry) }, func(e *ipcsem.IpcSemEntry, _ *dataImage) (int64, error) {
				if err := mode(name, "sem "+itoa(e.GetDesc().GetId()), e.GetDesc().GetMode()); err != nil {
					return 0, err
				}
				return (2*int64(e.GetNsems()) + 7) &^ 7, nil
			})
		}
		return nil
	})
}

// maxIPCMsg is the largest message CRIU restores (criu/ipc_ns.c, MSGMAX).
const maxIPCMsg = 8192

// mappedWrites are the files of files.img mapped shared by a task with a
// descriptor open for writing (mm-*.img vmas' fdflags), by file ID: CRIU
// opens a mapped file with the vma's own flags, not the file entry's
// (criu/files-reg.c, open_filemap), as root, so a shared mapping of a file
// the container's user may only read would write it. CheckAccess asks
// write access of them.
func mappedWrites(dir string) (map[uint32]uint32, error) {
	out := map[uint32]uint32{}
	var m mm.MmEntry
	err := eachImageEntry(dir, mmImage, "MM", &m, func() {
		for _, v := range m.GetVmas() {
			if v.GetStatus()&vmaFileShared != 0 && accessOf(v.GetFdflags())&mayWrite != 0 {
				out[uint32(v.GetShmid())] |= mayWrite
			}
		}
	})
	return out, err
}
