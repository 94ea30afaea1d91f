package criucheck

import (
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/tty"
	"golang.org/x/sys/unix"
)

// Socket constants (include/linux/socket.h, net.h, netlink.h).
const (
	sockRaw         = 3
	netlinkRoute    = 0
	netlinkSockDiag = 4
	netlinkGeneric  = 16
	privPorts       = 1024
	// maxSockPriority is the highest SO_PRIORITY set without CAP_NET_ADMIN.
	maxSockPriority = 6
)

// checkFiles walks files.img, the open files of the whole tree (fdinfo-*.img
// only point into it), and the terminals of tty-info.img. A file is opened
// by the restore in the container's mount namespace by its path
// (criu/files-reg.c, open_path); what the container could not open or
// create itself is refused: another namespace's handle, a watch on a file by
// its handle (open_by_handle_at reaches any file of a file system, the
// container's bind mounts included), a device the runtime does not give it,
// sockets that need capabilities the spec does not grant.
func (c *checker) checkFiles() error {
	const name = "files.img"
	c.fileIDs = map[uint32]bool{}
	if c.has("files", name) {
		err := eachEntry(c.dir, name, "FILES", func() *fdinfo.FileEntry { return new(fdinfo.FileEntry) }, c.checkFile)
		if err != nil {
			return asRefusal(name, err)
		}
	}
	const ttys = "tty-info.img"
	if c.has("tty", ttys) {
		err := eachEntry(c.dir, ttys, "TTY_INFO", func() *tty.TtyInfoEntry { return new(tty.TtyInfoEntry) }, func(t *tty.TtyInfoEntry) error {
			switch t.GetType() {
			case tty.TtyType_PTY, tty.TtyType_CTTY:
				return nil
			case tty.TtyType_EXT_TTY, tty.TtyType_CONSOLE:
				if c.p.spec.Process.Terminal {
					return nil // the container's console, runc's pseudo-terminal
				}
			}
			return refuse(ttys, "type", "%v: a terminal device of the host; a container has pseudo-terminals only", t.GetType())
		})
		if err != nil {
			return asRefusal(ttys, err)
		}
	}
	return nil
}

func (c *checker) checkFile(f *fdinfo.FileEntry) error {
	const name = "files.img"
	field := func(s string) string { return "file " + itoa(f.GetId()) + " " + f.GetType().String() + " " + s }
	c.fileIDs[f.GetId()] = true
	switch f.GetType() {
	case fdinfo.FdTypes_REG:
		r := f.GetReg()
		if r == nil {
			return refuse(name, field("reg"), "missing")
		}
		if why := c.p.openPathWhy(r.GetName()); why != "" {
			return refuse(name, field("reg.name"), "%q %s", r.GetName(), why)
		}
		if r.GetExt() {
			return refuse(name, field("reg.ext"), "an external file: the restore would take it from the host")
		}
		// The kernel keeps none of these in a file's flags; CRIU would
		// pass them to open as root (criu/files-reg.c, do_open_reg).
		if fl := r.GetFlags(); fl&(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC|unix.O_NOCTTY) != 0 {
			return refuse(name, field("reg.flags"), "%#o has flags no open file keeps", fl)
		}
	case fdinfo.FdTypes_PIPE, fdinfo.FdTypes_FIFO, fdinfo.FdTypes_EVENTFD, fdinfo.FdTypes_EVENTPOLL,
		fdinfo.FdTypes_SIGNALFD, fdinfo.FdTypes_MEMFD, fdinfo.FdTypes_TTY:
		// Objects of the tree itself; a FIFO's and a terminal's paths are
		// REG entries of their own (tty-info.img says which terminals).
	case fdinfo.FdTypes_TIMERFD:
		if ck := f.GetTfd().GetClockid(); (ck == unix.CLOCK_REALTIME_ALARM || ck == unix.CLOCK_BOOTTIME_ALARM) && !c.p.may("CAP_WAKE_ALARM") {
			return refuse(name, field("tfd.clockid"), "an alarm clock; it needs CAP_WAKE_ALARM")
		}
	case fdinfo.FdTypes_PIDFD:
		if !c.pids[uint32(f.GetPidfd().GetNspid())] {
			return refuse(name, field("pidfd.nspid"), "%d is not a process of the checkpoint", f.GetPidfd().GetNspid())
		}
	case fdinfo.FdTypes_UNIXSK:
		// A name is a path or an abstract name of the pod's network
		// namespace; a socket CRIU should connect outside the tree
		// (external, or a peer it is told to find) is refused.
		u := f.GetUsk()
		if u.GetUflags() != 0 {
			return refuse(name, field("usk.uflags"), "%#x: a socket connected outside the checkpoint", u.GetUflags())
		}
		// A path name is bound, unlinked and connected to by CRIU as
		// root from the container's root (criu/sk-unix.c).
		p, why := uskPath(u.GetName(), u.GetNameDir())
		if why == "" && p != "" {
			why = c.p.openPathWhy(p)
		}
		if why != "" {
			return refuse(name, field("usk.name"), "%q %s", u.GetName(), why)
		}
	case fdinfo.FdTypes_INETSK:
		s := f.GetIsk()
		if s == nil {
			return refuse(name, field("isk"), "missing")
		}
		if s.GetType() == sockRaw && !c.p.may("CAP_NET_RAW") {
			return refuse(name, field("isk.type"), "a raw socket; it needs CAP_NET_RAW")
		}
		if p := s.GetSrcPort(); p > 0 && p < privPorts && s.GetType() != sockRaw && !c.p.may("CAP_NET_BIND_SERVICE") {
			return refuse(name, field("isk.src_port"), "%d; binding a port below %d needs CAP_NET_BIND_SERVICE", p, privPorts)
		}
		if err := c.checkSockOpts(name, field("isk.opts"), s.GetOpts().GetSoMark(), s.GetOpts().GetSoPriority()); err != nil {
			return err
		}
	case fdinfo.FdTypes_PACKETSK:
		if !c.p.may("CAP_NET_RAW") {
			return refuse(name, field(""), "a packet socket; it needs CAP_NET_RAW")
		}
	case fdinfo.FdTypes_NETLINKSK:
		p := f.GetNlsk().GetProtocol()
		if p != netlinkRoute && p != netlinkSockDiag && p != netlinkGeneric && !c.p.may("CAP_NET_ADMIN") {
			return refuse(name, field("nlsk.protocol"), "netlink protocol %d; it needs CAP_NET_ADMIN", p)
		}
		if len(f.GetNlsk().GetGroups()) > 0 && !c.p.may("CAP_NET_ADMIN") {
			return refuse(name, field("nlsk.groups"), "multicast groups; binding them needs CAP_NET_ADMIN")
		}
	case fdinfo.FdTypes_TUNF:
		if !c.p.may("CAP_NET_ADMIN") {
			return refuse(name, field(""), "a tun device; it needs CAP_NET_ADMIN")
		}
	case fdinfo.FdTypes_INOTIFY:
		// A watch is opened by its path where the image has one, else by
		// handle (criu/fsnotify.c), which reaches any file of the file
		// system, past the container's bind mounts.
		for _, wd := range f.GetIfy().GetWd() {
			p := wd.GetFHandle().GetPath()
			if p == "" {
				return refuse(name, field("ify.wd"), "a watch without a path: the restore would open its file by handle")
			}
			if why := c.p.openPathWhy(p); why != "" {
				return refuse(name, field("ify.wd.f_handle.path"), "%q %s", p, why)
			}
		}
	case fdinfo.FdTypes_FANOTIFY:
		return refuse(name, field(""), "fanotify: it needs CAP_SYS_ADMIN and marks files by handle")
	case fdinfo.FdTypes_NS:
		return refuse(name, field(""), "a namespace file: a handle on a namespace the restore would open as root")
	case fdinfo.FdTypes_BPFMAP:
		return refuse(name, field(""), "a BPF map")
	case fdinfo.FdTypes_EXT:
		return refuse(name, field(""), "an external file: the restore would take it from the host")
	default:
		return refuse(name, field(""), "a file kind a container checkpoint does not have")
	}
	return nil
}

// checkSockOpts: CRIU sets a socket's options as root (criu/sockets.c,
// restore_socket_opts); a mark or a high priority needs CAP_NET_ADMIN.
func (c *checker) checkSockOpts(image, field string, mark, prio uint32) error {
	if c.p.may("CAP_NET_ADMIN") {
		return nil
	}
	if mark != 0 {
		return refuse(image, field+".so_mark", "%d; marking packets needs CAP_NET_ADMIN", mark)
	}
	if prio > maxSockPriority {
		return refuse(image, field+".so_priority", "%d; above %d needs CAP_NET_ADMIN", prio, maxSockPriority)
	}
	return nil
}

// checkPath returns why a path the restore opens or creates is not one of
// the container's, or "": the rules of every path, relative ones (a tmpfs
// image's entries) too. A path CRIU opens from the container's root has the
// rules of openPathWhy on top.
func checkPath(p string) string {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "is empty or has a NUL"
	}
	if len(p) > 4096 {
		return "is longer than PATH_MAX"
	}
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return "has a .. component"
		}
	}
	return ""
}
