// Package criutest writes CRIU image directories for tests: a one-process
// tree that a given OCI spec allows, in CRIU's own format (the magics of
// go-criu's magic package, entries as criu/image.c writes them), for tests
// to edit field by field.
package criutest

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/creds"
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	fsimg "github.com/checkpoint-restore/go-criu/v8/crit/images/fs"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	ipcvar "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-var"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/netdev"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pidns"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/seccomp"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timens"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/utsns"
	"github.com/checkpoint-restore/go-criu/v8/magic"
	"github.com/moby/sys/capability"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// Images is an images directory to be written.
type Images struct {
	Inventory *inventory.InventoryEntry
	Pstree    []*pstree.PstreeEntry
	Cores     map[uint32]*criucore.CoreEntry // by thread ID
	Files     []*fdinfo.FileEntry
	Mounts    []*mnt.MntEntry
	Seccomp   *seccomp.SeccompEntry
	// NetNS and PidNS, when set, are the root task's namespace images.
	NetNS *netdev.NetnsEntry
	PidNS *pidns.PidnsEntry
	// Cgroup is cgroup.img, when set.
	Cgroup *cgroup.CgroupEntry
	// FS are the live tasks' roots, cwds and umasks, by PID.
	FS map[uint32]*fsimg.FsEntry
	// UTS and IPCVar, when set, are the root task's UTS and IPC namespace
	// images; Timens the clocks (timens-0.img).
	UTS    *utsns.UtsnsEntry
	IPCVar *ipcvar.IpcVarEntry
	Timens *timens.TimensEntry
	// Raw files written as they are (names to contents).
	Raw map[string][]byte
}

// Namespace IDs of the tree: CRIU's own (the host's) and the container's.
const (
	HostNS      = 1
	ContainerNS = 100
)

// File IDs of files.img's entries for the root task's root and cwd, both
// the container's root, as CRIU dumps them (flags 0).
const (
	RootFileID = 1
	CwdFileID  = 2
)

// Hostname is the root task's host name in the UTS image.
const Hostname = "pod-a"

// RegFile is a regular file entry of files.img for path name.
func RegFile(id uint32, name string, flags uint32) *fdinfo.FileEntry {
	return &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(id), Reg: &regfile.RegFileEntry{
		Id: u32(id), Flags: u32(flags), Pos: proto.Uint64(0), Name: proto.String(name),
		Fown: &fown.FownEntry{Uid: u32(0), Euid: u32(0), Signum: u32(0), PidType: u32(0), Pid: u32(0)}}}
}

// IPCDefaults is the IPC image of a new IPC namespace, as CRIU dumps it
// (criu/ipc_ns.c, dump_ipc_var; the next IDs unset).
func IPCDefaults() *ipcvar.IpcVarEntry {
	return &ipcvar.IpcVarEntry{SemCtls: []uint32{32000, 1024000000, 500, 32000}, MsgCtlmax: u32(8192), MsgCtlmnb: u32(16384),
		MsgCtlmni: u32(32000), AutoMsgmni: u32(0), ShmCtlmax: proto.Uint64(^uint64(0) - 1<<24), ShmCtlall: proto.Uint64(^uint64(0) - 1<<24),
		ShmCtlmni: u32(4096), ShmRmidForced: u32(0), MqQueuesMax: u32(256), MqMsgMax: u32(10), MqMsgsizeMax: u32(8192),
		MqMsgDefault: u32(10), MqMsgsizeDefault: u32(8192)}
}

// ForSpec is a one-process tree (PID 1) that spec allows: its credentials
// are the spec's user and capability sets, it is in the spec's namespaces,
// and the mounts are the spec's.
func ForSpec(spec *specs.Spec) *Images {
	ids := &criucore.TaskKobjIdsEntry{VmId: u32(1), FilesId: u32(1), FsId: u32(1), SighandId: u32(1)}
	nsField := map[specs.LinuxNamespaceType]**uint32{
		specs.PIDNamespace: &ids.PidNsId, specs.NetworkNamespace: &ids.NetNsId, specs.IPCNamespace: &ids.IpcNsId,
		specs.UTSNamespace: &ids.UtsNsId, specs.MountNamespace: &ids.MntNsId, specs.UserNamespace: &ids.UserNsId,
		specs.CgroupNamespace: &ids.CgroupNsId, specs.TimeNamespace: &ids.TimeNsId,
	}
	setNS := func(t specs.LinuxNamespaceType, v uint32) {
		if f := nsField[t]; f != nil {
			*f = u32(v)
		}
	}
	for t := range nsField {
		setNS(t, HostNS)
	}
	hostIDs := proto.Clone(ids).(*criucore.TaskKobjIdsEntry)
	if spec.Linux != nil {
		for i, n := range spec.Linux.Namespaces {
			setNS(n.Type, ContainerNS+uint32(i))
		}
	}
	u := spec.Process.User
	cr := &creds.CredsEntry{
		Uid: u32(u.UID), Gid: u32(u.GID), Euid: u32(u.UID), Egid: u32(u.GID),
		Suid: u32(u.UID), Sgid: u32(u.GID), Fsuid: u32(u.UID), Fsgid: u32(u.GID),
		Secbits: u32(0), Groups: append([]uint32(nil), u.AdditionalGids...),
	}
	if c := spec.Process.Capabilities; c != nil {
		cr.CapBnd, cr.CapEff, cr.CapPrm, cr.CapInh, cr.CapAmb = Caps(c.Bounding...), Caps(c.Effective...), Caps(c.Permitted...), Caps(c.Inheritable...), Caps(c.Ambient...)
	}
	if spec.Process.NoNewPrivileges {
		cr.NoNewPrivs = u32(1)
	}
	th := &criucore.ThreadCoreEntry{FutexRla: proto.Uint64(0), FutexRlaLen: u32(0), Creds: cr}
	var sc *seccomp.SeccompEntry
	if spec.Linux != nil && spec.Linux.Seccomp != nil {
		th.SeccompMode = criucore.SeccompMode_filter.Enum()
		th.SeccompFilter = u32(0)
		sc = &seccomp.SeccompEntry{SeccompFilters: []*seccomp.SeccompFilter{{Filter: AllowAll()}}}
	}
	core := &criucore.CoreEntry{
		Mtype: criucore.CoreEntry_X86_64.Enum(),
		Tc: &criucore.TaskCoreEntry{TaskState: u32(1), ExitCode: u32(0), Personality: u32(0), Flags: u32(0),
			BlkSigset: proto.Uint64(0), Comm: proto.String("sh")},
		Ids:        ids,
		ThreadCore: th,
	}
	im := &Images{
		Inventory: &inventory.InventoryEntry{ImgVersion: u32(2), RootIds: hostIDs, NsPerId: proto.Bool(true)},
		Files:     []*fdinfo.FileEntry{RegFile(RootFileID, "/", 0), RegFile(CwdFileID, "/", 0)},
		FS:        map[uint32]*fsimg.FsEntry{1: {RootId: u32(RootFileID), CwdId: u32(CwdFileID), Umask: u32(0o22)}},
		Timens: &timens.TimensEntry{Monotonic: &timens.Timespec{TvSec: proto.Uint64(86400), TvNsec: proto.Uint64(5)},
			Boottime: &timens.Timespec{TvSec: proto.Uint64(86500), TvNsec: proto.Uint64(0)}},
		Pstree:  []*pstree.PstreeEntry{{Pid: u32(1), Ppid: u32(0), Pgid: u32(1), Sid: u32(1), Threads: []uint32{1}}},
		Cores:   map[uint32]*criucore.CoreEntry{1: core},
		Seccomp: sc,
		Raw:     map[string][]byte{"pages-1.img": make([]byte, 4096)},
	}
	if spec.Linux != nil {
		for _, n := range spec.Linux.Namespaces {
			switch {
			case n.Type == specs.NetworkNamespace && n.Path != "":
				im.NetNS = &netdev.NetnsEntry{ExtKey: proto.String("extRootNetNS")}
			case n.Type == specs.PIDNamespace && n.Path != "":
				im.PidNS = &pidns.PidnsEntry{ExtKey: proto.String("extRootPidNS")}
			case n.Type == specs.UTSNamespace:
				im.UTS = &utsns.UtsnsEntry{Nodename: proto.String(Hostname), Domainname: proto.String("(none)")}
			case n.Type == specs.IPCNamespace:
				im.IPCVar = IPCDefaults()
			}
		}
	}
	v2 := false
	if spec.Linux != nil {
		for _, n := range spec.Linux.Namespaces {
			v2 = v2 || n.Type == specs.CgroupNamespace
		}
	}
	im.Cgroup = CgroupV1()
	if v2 {
		im.Cgroup = CgroupV2()
	}
	im.Mounts = mountsOf(spec, v2)
	return im
}

// mountsOf are the mounts runc makes for spec, as CRIU dumps them: the
// root, the spec's mounts (binds as external ones; the cgroup mount as a
// tmpfs of one mount per hierarchy on cgroup v1, the unified hierarchy on
// v2), its read-only paths as binds of their own file system, its masked
// paths as binds of /dev/null.
func mountsOf(spec *specs.Spec, v2 bool) []*mnt.MntEntry {
	out := []*mnt.MntEntry{Mount(1, 0, "/", mnt.Fstype_AUTO, 0)}
	add := func(e *mnt.MntEntry) *mnt.MntEntry {
		e.MntId = u32(uint32(len(out) + 1))
		out = append(out, e)
		return e
	}
	for _, m := range spec.Mounts {
		switch m.Type {
		case "bind", "rbind", "":
			add(Mount(0, 1, m.Destination, mnt.Fstype_AUTO, flagsOf(m.Options))).ExtKey = proto.String(m.Destination)
		case "cgroup":
			if v2 {
				add(Mount(0, 1, m.Destination, mnt.Fstype_CGROUP2, flagsOf(m.Options)))
				continue
			}
			add(Mount(0, 1, m.Destination, mnt.Fstype_TMPFS, flagsOf([]string{"nosuid", "nodev", "noexec"})))
			for _, h := range []string{"cpu,cpuacct", "memory", "pids", "systemd"} {
				add(Mount(0, 1, m.Destination+"/"+h, mnt.Fstype_CGROUP, flagsOf(m.Options))).Root = proto.String("/" + CgroupV1Dir)
			}
		default:
			add(Mount(0, 1, m.Destination, fstypes[m.Type], flagsOf(m.Options)))
		}
	}
	if spec.Linux == nil {
		return out
	}
	for _, p := range spec.Linux.ReadonlyPaths {
		var on specs.Mount
		for _, m := range spec.Mounts {
			if strings.HasPrefix(p, m.Destination+"/") {
				on = m
			}
		}
		add(Mount(0, 1, p, fstypes[on.Type], 1)).Root = proto.String(strings.TrimPrefix(p, on.Destination))
	}
	for _, p := range spec.Linux.MaskedPaths {
		add(Mount(0, 1, p, mnt.Fstype_AUTO, 1)).ExtKey = proto.String("/dev/null")
	}
	return out
}

var fstypes = map[string]mnt.Fstype{"proc": mnt.Fstype_PROC, "sysfs": mnt.Fstype_SYSFS, "tmpfs": mnt.Fstype_TMPFS,
	"devpts": mnt.Fstype_DEVPTS, "mqueue": mnt.Fstype_MQUEUE, "cgroup": mnt.Fstype_CGROUP, "cgroup2": mnt.Fstype_CGROUP2}

// flagsOf are the mount flags of the spec's options that checks compare.
func flagsOf(opts []string) uint32 {
	var f uint32
	for _, o := range opts {
		switch o {
		case "ro":
			f |= 1
		case "nosuid":
			f |= 2
		case "nodev":
			f |= 4
		case "noexec":
			f |= 8
		}
	}
	return f
}

// Mount is a mount entry.
func Mount(id, parent uint32, mountpoint string, t mnt.Fstype, flags uint32) *mnt.MntEntry {
	return &mnt.MntEntry{Fstype: u32(uint32(t)), MntId: u32(id), RootDev: u32(0), ParentMntId: u32(parent), Flags: u32(flags),
		Root: proto.String("/"), Mountpoint: proto.String(mountpoint), Source: proto.String("none"), Options: proto.String("")}
}

// Caps encodes capability names as CRIU's words.
func Caps(names ...string) []uint32 {
	w := []uint32{0, 0}
	for _, n := range names {
		for _, c := range capability.ListKnown() {
			if "CAP_"+strings.ToUpper(c.String()) == n {
				w[int(c)/32] |= 1 << (uint(c) % 32)
			}
		}
	}
	return w
}

// AllowAll is a seccomp filter returning SECCOMP_RET_ALLOW.
func AllowAll() []byte {
	return Program([4]uint32{0x06, 0, 0, 0x7fff0000})
}

// Program encodes BPF instructions {code, jt, jf, k} as the kernel's
// struct sock_filter array.
func Program(insns ...[4]uint32) []byte {
	b := make([]byte, 0, 8*len(insns))
	for _, in := range insns {
		b = binary.LittleEndian.AppendUint16(b, uint16(in[0]))
		b = append(b, byte(in[1]), byte(in[2]))
		b = binary.LittleEndian.AppendUint32(b, in[3])
	}
	return b
}

// Write writes the images into dir.
func (im *Images) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	w := func(name, mg string, ms ...proto.Message) error {
		return WriteImage(filepath.Join(dir, name), mg, ms...)
	}
	if err := w("inventory.img", "INVENTORY", im.Inventory); err != nil {
		return err
	}
	if err := w("pstree.img", "PSTREE", Messages(im.Pstree)...); err != nil {
		return err
	}
	for tid, c := range im.Cores {
		if err := w(fmt.Sprintf("core-%d.img", tid), "CORE", c); err != nil {
			return err
		}
	}
	if err := w("files.img", "FILES", Messages(im.Files)...); err != nil {
		return err
	}
	if err := w("mountpoints-12.img", "MNTS", Messages(im.Mounts)...); err != nil {
		return err
	}
	if im.Seccomp != nil {
		if err := w("seccomp.img", "SECCOMP", im.Seccomp); err != nil {
			return err
		}
	}
	root := im.Cores[im.Pstree[0].GetPid()].GetIds()
	if im.NetNS != nil {
		if err := w(fmt.Sprintf("netns-%d.img", root.GetNetNsId()), "NETNS", im.NetNS); err != nil {
			return err
		}
	}
	if im.PidNS != nil {
		if err := w(fmt.Sprintf("pidns-%d.img", root.GetPidNsId()), "PIDNS", im.PidNS); err != nil {
			return err
		}
	}
	if im.Cgroup != nil {
		if err := w("cgroup.img", "CGROUP", im.Cgroup); err != nil {
			return err
		}
	}
	if im.UTS != nil {
		if err := w(fmt.Sprintf("utsns-%d.img", root.GetUtsNsId()), "UTSNS", im.UTS); err != nil {
			return err
		}
	}
	if im.IPCVar != nil {
		if err := w(fmt.Sprintf("ipcns-var-%d.img", root.GetIpcNsId()), "IPC_VAR", im.IPCVar); err != nil {
			return err
		}
	}
	if im.Timens != nil {
		if err := w("timens-0.img", "TIMENS", im.Timens); err != nil {
			return err
		}
	}
	for pid, e := range im.FS {
		if err := w(fmt.Sprintf("fs-%d.img", pid), "FS", e); err != nil {
			return err
		}
	}
	for name, b := range im.Raw {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Messages is xs as proto messages, for Encode and WriteImage.
func Messages[M proto.Message](xs []M) []proto.Message {
	out := make([]proto.Message, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// WriteImage writes one image file (Encode).
func WriteImage(path, magicName string, ms ...proto.Message) error {
	b, err := Encode(magicName, ms...)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return os.WriteFile(path, b, 0o600)
}

// Encode is an image: the common magic (the service magic for the
// inventory), the image's magic, then each message with its length.
func Encode(magicName string, ms ...proto.Message) ([]byte, error) {
	mg := magic.LoadMagic()
	first := mg.ByName["IMG_COMMON"]
	if magicName == "INVENTORY" {
		first = mg.ByName["IMG_SERVICE"]
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(first))
	b = binary.LittleEndian.AppendUint32(b, uint32(mg.ByName[magicName]))
	for _, m := range ms {
		e, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b, nil
}

// Decode reads the entries of an image of test data (Encode's layout) into
// messages from newMsg; data after the entries (a ghost file's) is not
// supported.
func Decode[M proto.Message](b []byte, newMsg func() M) ([]M, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%d bytes is not an image", len(b))
	}
	mg := magic.LoadMagic()
	if first := uint64(binary.LittleEndian.Uint32(b)); first == mg.ByName["IMG_COMMON"] || first == mg.ByName["IMG_SERVICE"] {
		b = b[8:]
	} else {
		b = b[4:] // the image's own magic only (the inventory)
	}
	var out []M
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("truncated entry")
		}
		n := int(binary.LittleEndian.Uint32(b))
		if len(b) < 4+n {
			return nil, fmt.Errorf("truncated entry")
		}
		m := newMsg()
		if err := proto.Unmarshal(b[4:4+n], m); err != nil {
			return nil, err
		}
		out = append(out, m)
		b = b[4+n:]
	}
	return out, nil
}

// DefaultSpec is the spec containerd's CRI makes for a container of a pod
// with no security settings (default capabilities, the RuntimeDefault
// seccomp profile's shape, the pod's namespaces, the usual mounts).
func DefaultSpec() *specs.Spec {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	return &specs.Spec{
		Process: &specs.Process{
			User:         specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
		},
		Root: &specs.Root{Path: "rootfs"},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/kubelet/pods/x/etc-hosts", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/sandboxes/x/shm", Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace, Path: "/proc/10/ns/ipc"}, {Type: specs.UTSNamespace, Path: "/proc/10/ns/uts"},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-x"},
			},
			MaskedPaths:   []string{"/proc/acpi", "/proc/kcore", "/proc/keys"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/sys"},
		},
	}
}

func u32(v uint32) *uint32 { return &v }

// The container's cgroup in the layouts below: the kubelet's cgroupfs
// driver's on cgroup v1, the systemd driver's on cgroup v2.
const (
	CgroupV1Dir = "kubepods/besteffort/pod0f4c/4be1c0ffee"
	CgroupV2Dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f4c.slice/cri-containerd-4be1c0ffee.scope"
)

// CgroupV1 is cgroup.img as CRIU dumps a container's task on a cgroup v1
// host: one entry per hierarchy (cpu and cpuacct co-mounted, systemd's
// named one, and the unified one of a hybrid host), each with the
// container's directory, and one set naming it in each.
func CgroupV1() *cgroup.CgroupEntry {
	hier := [][]string{{"cpu", "cpuacct"}, {"memory"}, {"pids"}, {"name=systemd"}, {""}}
	e := &cgroup.CgroupEntry{}
	set := &cgroup.CgSetEntry{Id: u32(1)}
	for _, h := range hier {
		e.Controllers = append(e.Controllers, &cgroup.CgControllerEntry{Cnames: h, Dirs: []*cgroup.CgroupDirEntry{{
			DirName:    proto.String(CgroupV1Dir),
			DirPerms:   &cgroup.CgroupPerms{Mode: u32(0o40755), Uid: u32(0), Gid: u32(0)},
			Properties: []*cgroup.CgroupPropEntry{{Name: proto.String("cgroup.clone_children"), Value: proto.String("0")}},
		}}})
		set.Ctls = append(set.Ctls, &cgroup.CgMemberEntry{Name: proto.String(strings.Join(h, ",")), Path: proto.String("/" + CgroupV1Dir)})
	}
	e.Sets = []*cgroup.CgSetEntry{set}
	return e
}

// CgroupV2 is cgroup.img as CRIU dumps a container's task on a cgroup v2
// host, the container in a cgroup namespace rooted at its cgroup: the
// unified hierarchy alone, and the member's namespace prefix the
// container's cgroup's length.
func CgroupV2() *cgroup.CgroupEntry {
	return &cgroup.CgroupEntry{
		Controllers: []*cgroup.CgControllerEntry{{Cnames: []string{""}, Dirs: []*cgroup.CgroupDirEntry{{
			DirName:    proto.String(CgroupV2Dir),
			DirPerms:   &cgroup.CgroupPerms{Mode: u32(0o40755), Uid: u32(0), Gid: u32(0)},
			Properties: []*cgroup.CgroupPropEntry{{Name: proto.String("memory.max"), Value: proto.String("max")}},
		}}}},
		Sets: []*cgroup.CgSetEntry{{Id: u32(1), Ctls: []*cgroup.CgMemberEntry{{
			Name: proto.String(""), Path: proto.String("/" + CgroupV2Dir), CgnsPrefix: u32(uint32(len("/" + CgroupV2Dir))),
		}}}},
	}
}
