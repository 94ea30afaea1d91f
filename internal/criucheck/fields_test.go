package criucheck

import (
	"encoding/binary"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/eventpoll"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	ghostfile "github.com/checkpoint-restore/go-criu/v8/crit/images/ghost-file"
	ipcdesc "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-desc"
	ipcmsg "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-msg"
	ipcshm "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-shm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/memfd"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	pipedata "github.com/checkpoint-restore/go-criu/v8/crit/images/pipe-data"
	skinet "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-inet"
	sknetlink "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-netlink"
	skopts "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-opts"
	skpacket "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-packet"
	skunix "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-unix"
	tcpstream "github.com/checkpoint-restore/go-criu/v8/crit/images/tcp-stream"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timer"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timerfd"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/tty"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// reachable are the messages reachable from the decoded images' messages
// (imageClasses), through message fields, by full name.
func reachable() map[protoreflect.FullName]protoreflect.MessageDescriptor {
	out := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if _, ok := out[md.FullName()]; ok {
			return
		}
		out[md.FullName()] = md
		fs := md.Fields()
		for i := 0; i < fs.Len(); i++ {
			if m := fs.Get(i).Message(); m != nil {
				walk(m)
			}
		}
	}
	for _, ic := range imageClasses {
		for _, r := range ic.roots {
			walk(r.ProtoReflect().Descriptor())
		}
	}
	return out
}

// unruled are the fields of msgs without a rule in rs; stale the rules of
// rs that name neither a message of msgs nor a field of one.
func unruled(rs fieldRuleSet, msgs map[protoreflect.FullName]protoreflect.MessageDescriptor) (unruled, stale []string) {
	named := map[protoreflect.FullName]bool{}
	for name, md := range msgs {
		named[name] = true
		fs := md.Fields()
		for i := 0; i < fs.Len(); i++ {
			fd := fs.Get(i)
			named[fd.FullName()] = true
			if _, ok := rs.rule(fd); !ok {
				unruled = append(unruled, string(fd.FullName()))
			}
		}
	}
	for name := range rs {
		if !named[name] {
			stale = append(stale, string(name))
		}
	}
	slices.Sort(unruled)
	slices.Sort(stale)
	return unruled, stale
}

// TestFieldRules: every field of every message an image is decoded into
// has a rule, and every rule names a message or field that exists. A new
// go-criu that adds a field fails here until the field is classified.
func TestFieldRules(t *testing.T) {
	msgs := reachable()
	missing, stale := unruled(fieldRules, msgs)
	for _, f := range missing {
		t.Errorf("%s has no rule in fields.go", f)
	}
	for _, r := range stale {
		t.Errorf("fields.go has a rule for %s, which no decoded message has", r)
	}
	counts := map[fieldClass]int{}
	for _, md := range msgs {
		fs := md.Fields()
		for i := 0; i < fs.Len(); i++ {
			r, _ := fieldRules.rule(fs.Get(i))
			counts[r.class]++
			if r.why == "" {
				t.Errorf("%s: a rule without its check or reason", fs.Get(i).FullName())
			}
		}
	}
	t.Logf("%d messages; fields checked %d, free %d, refused %d", len(msgs), counts[classChecked], counts[classFree], counts[classRefused])
}

// TestFieldRulesWalkFindsGaps is the test of TestFieldRules: a table with a
// field's rule removed, a message's rule removed, and a rule for a field
// that does not exist is reported for each.
func TestFieldRulesWalkFindsGaps(t *testing.T) {
	rs := maps.Clone(fieldRules)
	delete(rs, "creds_entry.cap_amb")
	delete(rs, "user_x86_regs_entry")
	rs["creds_entry.cap_all"] = checked("nothing")
	missing, stale := unruled(rs, reachable())
	for _, want := range []string{"creds_entry.cap_amb", "user_x86_regs_entry.ip", "user_x86_regs_entry.mode"} {
		if !slices.Contains(missing, want) {
			t.Errorf("%s is not reported without its rule; reported %v", want, missing)
		}
	}
	if !slices.Equal(stale, []string{"creds_entry.cap_all"}) {
		t.Errorf("stale rules %v, want creds_entry.cap_all", stale)
	}
}

// TestImageClasses: every image file imageKinds admits is either decoded
// into messages the rules cover or says why not, and every kind with no
// check of its own is not decoded.
func TestImageClasses(t *testing.T) {
	covered := make([]bool, len(imageKinds))
	for _, ic := range imageClasses {
		if (len(ic.roots) == 0) == (ic.notDecoded == "") {
			t.Errorf("%s: give either its messages or why it is not decoded", ic.example)
		}
		kind, ok := kindOf(ic.example)
		if !ok {
			t.Errorf("%s: no image kind admits it", ic.example)
			continue
		}
		if kind == "" && len(ic.roots) > 0 {
			t.Errorf("%s: decoded, but its kind has no check that decodes it", ic.example)
		}
		for i, k := range imageKinds {
			if k.re.MatchString(ic.example) {
				covered[i] = true
			}
		}
	}
	for i, k := range imageKinds {
		if !covered[i] {
			t.Errorf("image kind %s has no example in imageClasses", k.re)
		}
	}
}

// checkImagesOf writes the images criutest.ForSpec makes for spec, edited
// by edit, and checks them.
func checkImagesOf(t *testing.T, spec *specs.Spec, edit func(*criutest.Images)) error {
	t.Helper()
	im := criutest.ForSpec(spec)
	if edit != nil {
		edit(im)
	}
	dir := t.TempDir()
	if err := im.Write(dir); err != nil {
		t.Fatal(err)
	}
	return Check(dir, spec, Options{})
}

func encode(t *testing.T, magic string, ms ...proto.Message) []byte {
	t.Helper()
	b, err := criutest.Encode(magic, ms...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withData is an image of entries each followed by its data.
func withData(t *testing.T, magic string, entries []proto.Message, data [][]byte) []byte {
	t.Helper()
	b := encode(t, magic)
	for i, m := range entries {
		e, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
		b = append(b, data[i]...)
	}
	return b
}

// TestRefusedFieldIsRefused: an image setting a field the rules refuse is
// refused naming the image and the field, before any check reads it.
func TestRefusedFieldIsRefused(t *testing.T) {
	spec := criutest.DefaultSpec()
	err := checkImagesOf(t, spec, func(im *criutest.Images) {
		im.Raw["ghost-file-5.img"] = encode(t, "GHOST_FILE", &ghostfile.GhostFileEntry{Uid: proto.Uint32(0), Gid: proto.Uint32(0),
			Mode: proto.Uint32(unix.S_IFREG | 0o644), SymlnkTarget: proto.String("/etc/shadow")})
	})
	var r *Refusal
	if !errors.As(err, &r) || r.Image != "ghost-file-5.img" || r.Field != "ghost_file_entry.symlnk_target" || !strings.Contains(r.Reason, "refuses") {
		t.Fatalf("got %v, want ghost-file-5.img refused naming ghost_file_entry.symlnk_target", err)
	}
}

// TestUnclassifiedFieldIsRefused: with a rule table that lacks a field's
// rule (as a new go-criu's field would), an image setting it is refused
// naming it; the same images pass with the whole table.
func TestUnclassifiedFieldIsRefused(t *testing.T) {
	spec := criutest.DefaultSpec()
	if err := checkImagesOf(t, spec, nil); err != nil {
		t.Fatalf("the spec's own checkpoint: %v", err)
	}
	old := fieldRules
	fieldRules = maps.Clone(old)
	delete(fieldRules, "task_core_entry.comm")
	defer func() { fieldRules = old }()
	err := checkImagesOf(t, spec, nil)
	var r *Refusal
	if !errors.As(err, &r) || r.Image != "core-1.img" || r.Field != "task_core_entry.comm" || !strings.Contains(r.Reason, "not classified") {
		t.Fatalf("got %v, want core-1.img refused naming task_core_entry.comm as not classified", err)
	}
}

// unprivileged is the default spec run as uid 1000 without capabilities.
func unprivileged(s *specs.Spec) {
	nonRoot(s)
	s.Process.Capabilities = &specs.LinuxCapabilities{}
}

// TestFieldChecks: the checks of fields no other check reads
// (fieldchecks.go), each refused naming its field, and what a real
// checkpoint has accepted.
func TestFieldChecks(t *testing.T) {
	owned := func(pid, uid uint32) func(*criutest.Images) {
		return func(im *criutest.Images) {
			f := regFile(5, "/etc/hostname", 0)
			f.Reg.Fown = &fown.FownEntry{Uid: proto.Uint32(uid), Euid: proto.Uint32(uid), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(pid)}
			im.Files = append(im.Files, f)
		}
	}
	usk := func(e func(*skunix.UnixSkEntry)) func(*criutest.Images) {
		return func(im *criutest.Images) {
			s := &skunix.UnixSkEntry{Id: proto.Uint32(6), Ino: proto.Uint32(60), Type: proto.Uint32(1), State: proto.Uint32(7),
				Flags: proto.Uint32(0), Uflags: proto.Uint32(0), Backlog: proto.Uint32(0), Peer: proto.Uint32(0),
				Fown: &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)},
				Opts: &skopts.SkOptsEntry{SoSndbuf: proto.Uint32(212992), SoRcvbuf: proto.Uint32(212992), SoSndTmoSec: proto.Uint64(0),
					SoSndTmoUsec: proto.Uint64(0), SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)}, Name: []byte{}}
			e(s)
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_UNIXSK.Enum(), Id: proto.Uint32(6), Usk: s})
		}
	}
	epoll := func(events uint32) func(*criutest.Images) {
		return func(im *criutest.Images) {
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_EVENTPOLL.Enum(), Id: proto.Uint32(7), Epfd: &eventpoll.EventpollFileEntry{
				Id: proto.Uint32(7), Flags: proto.Uint32(2), Fown: regFile(0, "x", 0).Reg.Fown,
				Tfd: []*eventpoll.EventpollTfdEntry{{Id: proto.Uint32(1), Tfd: proto.Uint32(3), Events: proto.Uint32(events), Data: proto.Uint64(0)}}}})
		}
	}
	ttyInfo := func(typ tty.TtyType, major, minor uint32) func(*criutest.Images) {
		return func(im *criutest.Images) {
			e := &tty.TtyInfoEntry{Id: proto.Uint32(1), Type: typ.Enum(), Locked: proto.Bool(false), Exclusive: proto.Bool(false),
				PacketMode: proto.Bool(false), Sid: proto.Uint32(1), Pgrp: proto.Uint32(1), Rdev: proto.Uint32(uint32(unix.Mkdev(major, minor)))}
			if typ == tty.TtyType_PTY {
				e.Pty = &tty.TtyPtyEntry{Index: proto.Uint32(0)}
			}
			im.Raw["tty-info.img"] = encode(t, "TTY_INFO", e)
		}
	}
	cgroupOptions := func(o string) func(*criutest.Images) {
		return func(im *criutest.Images) {
			for _, m := range im.Mounts {
				if mnt.Fstype(m.GetFstype()) == mnt.Fstype_CGROUP {
					m.Options = proto.String(o)
					return
				}
			}
			t.Fatal("no cgroup v1 mount in the images")
		}
	}
	pipes := func(size uint32, data []byte) func(*criutest.Images) {
		return func(im *criutest.Images) {
			im.Raw["pipes-data.img"] = withData(t, "PIPES_DATA", []proto.Message{&pipedata.PipeDataEntry{PipeId: proto.Uint32(9),
				Bytes: proto.Uint32(5), Size: proto.Uint32(size)}}, [][]byte{data})
		}
	}
	shm := func(mode, hugetlb uint32) func(*criutest.Images) {
		return func(im *criutest.Images) {
			e := &ipcshm.IpcShmEntry{Desc: &ipcdesc.IpcDescEntry{Key: proto.Uint32(1), Uid: proto.Uint32(0), Gid: proto.Uint32(0), Cuid: proto.Uint32(0),
				Cgid: proto.Uint32(0), Mode: proto.Uint32(mode), Id: proto.Uint32(0)}, Size: proto.Uint64(6)}
			if hugetlb != 0 {
				e.HugetlbFlag = proto.Uint32(hugetlb)
			}
			name := "ipcns-shm-" + itoa(im.Cores[1].GetIds().GetIpcNsId()) + ".img"
			im.Raw[name] = withData(t, "IPCNS_SHM", []proto.Message{e}, [][]byte{make([]byte, 8)})
		}
	}
	cases := []checkCase{
		// Owners of files.
		{name: "a file owned by the process", spec: unprivileged, edit: owned(1, 1000)},
		{name: "a file owned as root in a non-root container", spec: unprivileged, edit: owned(1, 0), field: "reg.fown.uid"},
		{name: "a file owned by a process outside the tree", edit: owned(77, 0), field: "reg.fown.pid"},
		{name: "a file without an owner keeps any uids", spec: unprivileged, edit: owned(0, 0)},
		// Sockets.
		{name: "a unix socket with a mark", edit: usk(func(s *skunix.UnixSkEntry) { s.Opts.SoMark = proto.Uint32(7) }), field: "usk.opts.so_mark"},
		{name: "a unix socket with a high priority", edit: usk(func(s *skunix.UnixSkEntry) { s.Opts.SoPriority = proto.Uint32(7) }), field: "usk.opts.so_priority"},
		{name: "a unix socket of the container", edit: usk(func(s *skunix.UnixSkEntry) { s.NsId = proto.Uint32(criutest.ContainerNS + 4) })},
		{name: "a unix socket of another network namespace", edit: usk(func(s *skunix.UnixSkEntry) { s.NsId = proto.Uint32(criutest.HostNS) }), field: "ns_id"},
		{name: "an inet socket of another network namespace", edit: func(im *criutest.Images) {
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_INETSK.Enum(), Id: proto.Uint32(8), Isk: &skinet.InetSkEntry{
				Id: proto.Uint32(8), Ino: proto.Uint32(80), Family: proto.Uint32(2), Type: proto.Uint32(2), Proto: proto.Uint32(17),
				State: proto.Uint32(7), SrcPort: proto.Uint32(0), DstPort: proto.Uint32(0), Flags: proto.Uint32(0), Backlog: proto.Uint32(0),
				Fown: regFile(0, "x", 0).Reg.Fown, Opts: &skopts.SkOptsEntry{SoSndbuf: proto.Uint32(1), SoRcvbuf: proto.Uint32(1),
					SoSndTmoSec: proto.Uint64(0), SoSndTmoUsec: proto.Uint64(0), SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)},
				NsId: proto.Uint32(criutest.HostNS)}})
		}, field: "ns_id"},
		{name: "a netlink socket connected to a multicast group", edit: func(im *criutest.Images) {
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_NETLINKSK.Enum(), Id: proto.Uint32(9), Nlsk: &sknetlink.NetlinkSkEntry{
				Id: proto.Uint32(9), Ino: proto.Uint32(90), Protocol: proto.Uint32(0), State: proto.Uint32(2), Flags: proto.Uint32(0),
				Portid: proto.Uint32(0), DstPortid: proto.Uint32(0), DstGroup: proto.Uint32(1), Fown: regFile(0, "x", 0).Reg.Fown,
				Opts: &skopts.SkOptsEntry{SoSndbuf: proto.Uint32(1), SoRcvbuf: proto.Uint32(1), SoSndTmoSec: proto.Uint64(0),
					SoSndTmoUsec: proto.Uint64(0), SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)}}})
		}, field: "dst_group"},
		{name: "an epoll watch with EPOLLWAKEUP", edit: epoll(epollWakeup | 1), field: "epfd.tfd.events"},
		{name: "an epoll watch", edit: epoll(1)},
		{name: "a timer on an alarm clock in the old timerfd.img", edit: func(im *criutest.Images) {
			im.Raw["timerfd.img"] = encode(t, "TIMERFD", &timerfd.TimerfdEntry{Id: proto.Uint32(3), Flags: proto.Uint32(0), Fown: regFile(0, "x", 0).Reg.Fown,
				Clockid: proto.Uint32(unix.CLOCK_REALTIME_ALARM), Ticks: proto.Uint64(0), SettimeFlags: proto.Uint32(0), Vsec: proto.Uint64(0),
				Vnsec: proto.Uint64(0), Isec: proto.Uint64(0), Insec: proto.Uint64(0)})
		}, spec: unprivileged, field: "timerfd 3 clockid"},
		// Task timers.
		{name: "a POSIX timer on an alarm clock", edit: func(im *criutest.Images) {
			im.Cores[1].Tc.Timers = &timer.TaskTimersEntry{Real: itimer(), Virt: itimer(), Prof: itimer(), Posix: []*timer.PosixTimerEntry{{
				ItId: proto.Uint32(0), ClockId: proto.Uint32(unix.CLOCK_BOOTTIME_ALARM), SiSigno: proto.Uint32(14), ItSigevNotify: proto.Uint32(0),
				SivalPtr: proto.Uint64(0), Overrun: proto.Uint32(0), Isec: proto.Uint64(0), Insec: proto.Uint64(0), Vsec: proto.Uint64(1), Vnsec: proto.Uint64(0)}}}
		}, field: "clock_id"},
		// Terminals.
		{name: "a pseudo-terminal", edit: ttyInfo(tty.TtyType_PTY, 136, 0)},
		{name: "a pseudo-terminal with a virtual console's numbers", edit: ttyInfo(tty.TtyType_PTY, 4, 1), field: "rdev"},
		// Descriptor tables.
		{name: "a socket with another SELinux context", edit: func(im *criutest.Images) {
			im.Raw["fdinfo-1.img"] = encode(t, "FDINFO", &fdinfo.FdinfoEntry{Id: proto.Uint32(1), Flags: proto.Uint32(0), Type: fdinfo.FdTypes_REG.Enum(),
				Fd: proto.Uint32(3), XattrSecuritySelinux: proto.String("system_u:system_r:kernel_t:s0")})
		}, field: "xattr_security_selinux"},
		{name: "a descriptor table", edit: func(im *criutest.Images) {
			im.Raw["fdinfo-1.img"] = encode(t, "FDINFO", &fdinfo.FdinfoEntry{Id: proto.Uint32(1), Flags: proto.Uint32(0), Type: fdinfo.FdTypes_REG.Enum(), Fd: proto.Uint32(3)})
		}},
		// Mount options.
		{name: "a cgroup mount with a release agent", edit: cgroupOptions("memory,release_agent=/proc/1/root/x"), field: "options"},
		{name: "a new named cgroup hierarchy", edit: cgroupOptions("none,name=x"), field: "options"},
		{name: "a cgroup mount of its controllers", edit: cgroupOptions("rw,cpu,cpuacct")},
		{name: "the systemd hierarchy", edit: cgroupOptions("xattr,name=systemd")},
		// The inventory.
		{name: "a run ID that is an nft command", edit: func(im *criutest.Images) {
			im.Inventory.DumpCriuRunId = proto.String("x;flush ruleset")
		}, field: "dump_criu_run_id"},
		{name: "a run ID", edit: func(im *criutest.Images) {
			im.Inventory.DumpCriuRunId = proto.String("0b4c6a9e-4a7b-4f0e-9c1d-2e3f4a5b6c7d")
		}},
		{name: "CRIU's own cgroup set dumped", edit: func(im *criutest.Images) { im.Inventory.RootCgSet = proto.Uint32(1) }, field: "root_cg_set"},
		{name: "CRIU's own cgroup set", edit: func(im *criutest.Images) { im.Inventory.RootCgSet = proto.Uint32(2) }},
		// Memfds, pipes, queues, IPC objects.
		{name: "a set-user-ID memfd", edit: func(im *criutest.Images) {
			im.Raw["memfd.img"] = encode(t, "MEMFD_INODE", &memfd.MemfdInodeEntry{Name: proto.String("x"), Uid: proto.Uint32(0), Gid: proto.Uint32(0),
				Size: proto.Uint64(0), Shmid: proto.Uint32(1), Seals: proto.Uint32(0), InodeId: proto.Uint64(1), Mode: proto.Uint32(unix.S_IFREG | unix.S_ISUID | 0o755)})
		}, field: "mode"},
		{name: "a pipe with its contents", edit: pipes(65536, []byte("hello"))},
		{name: "a pipe above pipe-max-size", spec: unprivileged, edit: pipes(1<<28, []byte("hello")), field: "size"},
		{name: "a pipe whose contents are cut short", edit: pipes(65536, []byte("he")), field: "pipes-data.img"},
		{name: "a queued packet", edit: func(im *criutest.Images) {
			im.Raw["sk-queues.img"] = withData(t, "SK_QUEUES", []proto.Message{&skpacket.SkPacketEntry{IdFor: proto.Uint32(6), Length: proto.Uint32(3)}}, [][]byte{[]byte("abc")})
		}},
		{name: "a TCP connection's state", edit: func(im *criutest.Images) {
			im.Raw["tcp-stream-3f.img"] = withData(t, "TCP_STREAM", []proto.Message{&tcpstream.TcpStreamEntry{InqLen: proto.Uint32(1), InqSeq: proto.Uint32(1),
				OutqLen: proto.Uint32(0), OutqSeq: proto.Uint32(1), OptMask: proto.Uint32(0), SndWscale: proto.Uint32(7), MssClamp: proto.Uint32(1460)}}, [][]byte{{'x'}})
		}},
		{name: "a shared memory segment", edit: shm(0o600, 0)},
		{name: "a shared memory segment asking for huge pages by its mode", edit: shm(0o600|0o4000, 0), field: "mode"},
		{name: "a huge-page segment", spec: unprivileged, edit: shm(0o600, 0o4000), field: "hugetlb_flag"},
		{name: "a message queue with its messages", edit: func(im *criutest.Images) {
			q := &ipcmsg.IpcMsgEntry{Desc: &ipcdesc.IpcDescEntry{Key: proto.Uint32(1), Uid: proto.Uint32(0), Gid: proto.Uint32(0), Cuid: proto.Uint32(0),
				Cgid: proto.Uint32(0), Mode: proto.Uint32(0o600), Id: proto.Uint32(0)}, Qbytes: proto.Uint32(16384), Qnum: proto.Uint32(1)}
			m, _ := proto.Marshal(&ipcmsg.IpcMsg{Mtype: proto.Uint64(1), Msize: proto.Uint32(3)})
			msg := binary.LittleEndian.AppendUint32(nil, uint32(len(m)))
			msg = append(append(msg, m...), 'a', 'b', 'c', 0, 0, 0, 0, 0)
			im.Raw["ipcns-msg-"+itoa(im.Cores[1].GetIds().GetIpcNsId())+".img"] = withData(t, "IPCNS_MSG", []proto.Message{q}, [][]byte{msg})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkEdit(t, tc.spec, tc.edit, tc.field) })
	}
}

func itimer() *timer.ItimerEntry {
	return &timer.ItimerEntry{Isec: proto.Uint64(0), Iusec: proto.Uint64(0), Vsec: proto.Uint64(0), Vusec: proto.Uint64(0)}
}

// TestMappedWritesNeedWriteAccess: a file mapped shared through a
// descriptor opened for writing (the vma's fdflags, with which CRIU opens
// it) needs write access, whatever its files.img entry's flags say.
func TestMappedWritesNeedWriteAccess(t *testing.T) {
	mapped := func(status uint32, fdflags uint32) func(dir string) {
		return func(dir string) {
			m := &mm.MmEntry{MmStartCode: proto.Uint64(0), MmEndCode: proto.Uint64(0), MmStartData: proto.Uint64(0), MmEndData: proto.Uint64(0),
				MmStartStack: proto.Uint64(0), MmStartBrk: proto.Uint64(0), MmBrk: proto.Uint64(0), MmArgStart: proto.Uint64(0), MmArgEnd: proto.Uint64(0),
				MmEnvStart: proto.Uint64(0), MmEnvEnd: proto.Uint64(0), ExeFileId: proto.Uint32(0),
				Vmas: []*vma.VmaEntry{{Start: proto.Uint64(1 << 20), End: proto.Uint64(1<<20 + 4096), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(5),
					Prot: proto.Uint32(unix.PROT_READ), Flags: proto.Uint32(unix.MAP_SHARED), Status: proto.Uint32(status), Fd: proto.Int64(-1), Fdflags: proto.Uint32(fdflags)}}}
			if err := criutest.WriteImage(filepath.Join(dir, "mm-1.img"), "MM", m); err != nil {
				t.Fatal(err)
			}
		}
	}
	const shared = 1<<0 | vmaFileShared // VMA_AREA_REGULAR | VMA_FILE_SHARED
	for _, tc := range []struct {
		name    string
		extra   func(string)
		refused bool
	}{
		{"mapped shared for reading", mapped(shared, unix.O_RDONLY), false},
		{"mapped shared for writing", mapped(shared, unix.O_RDWR), true},
		{"mapped private from a descriptor for writing", mapped(1<<0|vmaFilePrivate, unix.O_RDWR), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newAccessFixture(t)
			err := f.check(t, []*fdinfo.FileEntry{regFile(5, "/etc/hostname", unix.O_RDONLY)}, tc.extra)
			if tc.refused != (err != nil) {
				t.Fatalf("refused %v, want %v: %v", err != nil, tc.refused, err)
			}
			if tc.refused && !strings.Contains(err.Error(), "writing") {
				t.Fatalf("refusal %v does not say writing", err)
			}
		})
	}
}
