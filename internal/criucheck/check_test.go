package criucheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/creds"
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fh"
	fsnotify "github.com/checkpoint-restore/go-criu/v8/crit/images/fsnotify"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/ns"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

func root(im *criutest.Images) *creds.CredsEntry { return im.Cores[1].ThreadCore.Creds }

func regFile(id uint32, name string, flags uint32) *fdinfo.FileEntry {
	return criutest.RegFile(id, name, flags)
}

func nonRoot(s *specs.Spec) {
	s.Process.User = specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{2000}}
	s.Process.NoNewPrivileges = true
}

// Every check on a checkpoint the spec allows, then one edit at a time:
// each edit is refused naming its field.
func TestCheck(t *testing.T) {
	defer setMmapMinAddr(65536)()
	cases := []checkCase{
		{name: "the spec's own", field: ""},
		{name: "a non-root spec's own", spec: nonRoot, field: ""},
		{name: "capability added to effective", edit: func(im *criutest.Images) { root(im).CapEff = criutest.Caps("CAP_SYS_ADMIN") }, field: "creds.cap_eff"},
		{name: "capability added to permitted", edit: func(im *criutest.Images) { root(im).CapPrm = criutest.Caps("CAP_CHOWN", "CAP_SYS_PTRACE") }, field: "creds.cap_prm"},
		{name: "capability added to inheritable", edit: func(im *criutest.Images) { root(im).CapInh = criutest.Caps("CAP_NET_ADMIN") }, field: "creds.cap_inh"},
		{name: "capability added to bounding", edit: func(im *criutest.Images) { root(im).CapBnd = criutest.Caps("CAP_SYS_MODULE") }, field: "creds.cap_bnd"},
		{name: "capability added to ambient", edit: func(im *criutest.Images) { root(im).CapAmb = criutest.Caps("CAP_CHOWN") }, field: "creds.cap_amb"},
		{name: "capability above 63", edit: func(im *criutest.Images) { root(im).CapEff = []uint32{0, 0, 1} }, field: "creds.cap_eff"},
		{name: "uid 0 in a non-root spec", spec: nonRoot, edit: func(im *criutest.Images) { root(im).Euid = proto.Uint32(0) }, field: "creds.euid"},
		{name: "fsgid changed in a non-root spec", spec: nonRoot, edit: func(im *criutest.Images) { root(im).Fsgid = proto.Uint32(0) }, field: "creds.fsgid"},
		{name: "a group the non-root spec lacks", spec: nonRoot, edit: func(im *criutest.Images) { root(im).Groups = []uint32{2000, 0} }, field: "creds.groups"},
		{name: "root spec with CAP_SETUID may run other users", edit: func(im *criutest.Images) { root(im).Uid, root(im).Euid = proto.Uint32(33), proto.Uint32(33) }},
		{name: "no_new_privs dropped", spec: nonRoot, edit: func(im *criutest.Images) { root(im).NoNewPrivs = nil }, field: "creds.no_new_privs"},
		{name: "securebits without CAP_SETPCAP", spec: func(s *specs.Spec) { s.Process.Capabilities = &specs.LinuxCapabilities{} },
			edit: func(im *criutest.Images) { root(im).Secbits = proto.Uint32(1) }, field: "creds.secbits"},
		{name: "an LSM profile of the image's", edit: func(im *criutest.Images) { root(im).LsmProfile = proto.String("unconfined-ish") }, field: "lsm_profile"},
		// As CRIU dumps a task confined by containerd's AppArmor profile
		// (criu/lsm.c, collect_lsm_profile reads /proc/<pid>/attr/current).
		{name: "the spec's AppArmor profile", spec: withAppArmor, edit: func(im *criutest.Images) {
			root(im).LsmProfile = proto.String("cri-containerd.apparmor.d (enforce)")
		}},
		{name: "no LSM label where the spec confines the process", spec: withAppArmor, field: "lsm_profile"},
		{name: "no LSM label where the spec has an SELinux label", spec: func(s *specs.Spec) {
			s.Process.SelinuxLabel = "system_u:system_r:container_t:s0:c1,c2"
		}, field: "lsm_profile"},
		{name: "the spec's SELinux label", spec: func(s *specs.Spec) { s.Process.SelinuxLabel = "system_u:system_r:container_t:s0:c1,c2" },
			edit: func(im *criutest.Images) {
				root(im).LsmProfile = proto.String("system_u:system_r:container_t:s0:c1,c2")
			}},
		{name: "no LSM label for an unconfined spec", spec: func(s *specs.Spec) { s.Process.ApparmorProfile = "unconfined" }},
		{name: "seccomp disabled", spec: withSeccomp, edit: func(im *criutest.Images) {
			im.Cores[1].ThreadCore.SeccompMode = criucore.SeccompMode_disabled.Enum()
		}, field: "seccomp_mode"},
		{name: "seccomp filter allowing what the profile denies", spec: withSeccomp, field: "seccomp_filters"},
		{name: "seccomp filter as strict as the profile", spec: withSeccomp, edit: func(im *criutest.Images) {
			im.Seccomp.SeccompFilters[0].Filter = denyPtrace()
		}},
		{name: "seccomp chain that loops", spec: withSeccomp, edit: func(im *criutest.Images) {
			im.Seccomp.SeccompFilters[0].Prev = proto.Uint32(0)
		}, field: "seccomp_filters"},
		{name: "the host's mount namespace", edit: func(im *criutest.Images) { im.Cores[1].Ids.MntNsId = proto.Uint32(criutest.HostNS) }, field: "ids.mnt_ns_id"},
		{name: "the host's network namespace", edit: func(im *criutest.Images) { im.Cores[1].Ids.NetNsId = proto.Uint32(criutest.HostNS) }, field: "ids.net_ns_id"},
		{name: "a user namespace the spec does not create", edit: func(im *criutest.Images) { im.Cores[1].Ids.UserNsId = proto.Uint32(7) }, field: "ids.user_ns_id"},
		{name: "a second task in a nested namespace", edit: addChildIn(func(ids *criucore.TaskKobjIdsEntry) { ids.NetNsId = proto.Uint32(999) }), field: "ids.net_ns_id"},
		{name: "a second task in the same namespaces", edit: addChildIn(func(*criucore.TaskKobjIdsEntry) {})},
		// What CRIU wrote for a `sleep` that had exited, unreaped, when
		// the pod was checkpointed (a real dump of the e2e suite).
		{name: "a dead child as CRIU dumps it", edit: func(im *criutest.Images) {
			addZombie(2327858608)(im)
			delete(im.Cores, 17)
			im.Raw["core-17.img"] = zombieCore
		}},
		{name: "a dead child listing two threads", edit: func(im *criutest.Images) {
			addZombie(17)(im)
			im.Pstree[1].Threads = []uint32{17, 18}
		}, field: "threads"},
		{name: "a dead child in a nested namespace", edit: func(im *criutest.Images) {
			addZombie(17)(im)
			ids := proto.Clone(im.Cores[1].Ids).(*criucore.TaskKobjIdsEntry)
			ids.NetNsId = proto.Uint32(999)
			b, err := criutest.Encode("IDS", ids)
			if err != nil {
				panic(err)
			}
			im.Raw["ids-17.img"] = b
		}, field: "ids.net_ns_id"},
		{name: "a dead child of another architecture", edit: func(im *criutest.Images) {
			addZombie(17)(im)
			im.Cores[17].Mtype = criucore.CoreEntry_AARCH64.Enum()
		}, field: "mtype"},
		{name: "the root task dead", edit: func(im *criutest.Images) { im.Cores[1].Tc.TaskState = proto.Uint32(2) }, field: "task_state"},
		{name: "a live task whose first thread is another's", edit: func(im *criutest.Images) {
			addChildIn(func(*criucore.TaskKobjIdsEntry) {})(im)
			im.Pstree[1].Threads = []uint32{1}
		}, field: "threads"},
		{name: "network namespace not the runtime's", edit: func(im *criutest.Images) { im.NetNS.ExtKey = proto.String("") }, field: "ext_key"},
		{name: "plugins", edit: func(im *criutest.Images) {
			im.Inventory.PluginsEntry = &inventory.PluginsEntry{Plugins: []string{"amdgpu_plugin"}}
		}, field: "plugins_entry"},
		{name: "a file outside through ..", edit: func(im *criutest.Images) { im.Files = append(im.Files, regFile(5, "/proc/../../etc/shadow", 0)) }, field: "reg.name"},
		{name: "a file opened with O_CREAT", edit: func(im *criutest.Images) { im.Files = append(im.Files, regFile(5, "/tmp/x", 0o100)) }, field: "reg.flags"},
		{name: "an ordinary open file", edit: func(im *criutest.Images) { im.Files = append(im.Files, regFile(5, "/etc/hostname", 0)) }},
		{name: "a namespace file", edit: func(im *criutest.Images) {
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_NS.Enum(), Id: proto.Uint32(6),
				Nsf: &ns.NsFileEntry{Id: proto.Uint32(6), NsId: proto.Uint32(1), NsCflag: proto.Uint32(0x40000000), Flags: proto.Uint32(0)}})
		}, field: "file_entry.nsf"},
		{name: "an inotify watch by handle", edit: func(im *criutest.Images) {
			im.Files = append(im.Files, &fdinfo.FileEntry{Type: fdinfo.FdTypes_INOTIFY.Enum(), Id: proto.Uint32(7),
				Ify: &fsnotify.InotifyFileEntry{Id: proto.Uint32(7), Flags: proto.Uint32(0), Fown: regFile(0, "x", 0).Reg.Fown,
					Wd: []*fsnotify.InotifyWdEntry{{Id: proto.Uint32(7), IIno: proto.Uint64(2), Mask: proto.Uint32(1), IgnoredMask: proto.Uint32(0),
						SDev: proto.Uint32(1), Wd: proto.Uint32(1), FHandle: &fh.FhEntry{Bytes: proto.Uint32(8), Type: proto.Uint32(1), Handle: make([]uint64, 16)}}}}})
		}, field: "ify.wd"},
		{name: "devtmpfs", edit: func(im *criutest.Images) {
			im.Mounts = append(im.Mounts, criutest.Mount(90, 1, "/dev", mnt.Fstype_DEVTMPFS, 0))
		}, field: "fstype"},
		{name: "sysfs read-write", edit: func(im *criutest.Images) {
			for _, m := range im.Mounts {
				if m.GetMountpoint() == "/sys" {
					m.Flags = proto.Uint32(0)
				}
			}
		}, field: "flags"},
		{name: "a volume moved elsewhere", edit: func(im *criutest.Images) {
			for _, m := range im.Mounts {
				if m.GetExtKey() == "/etc/hosts" {
					m.Mountpoint = proto.String("/etc/passwd")
				}
			}
		}, field: "external mount"},
		{name: "a proc mount where the spec has none", edit: func(im *criutest.Images) {
			im.Mounts = append(im.Mounts, criutest.Mount(91, 1, "/host", mnt.Fstype_PROC, 0))
		}, field: "fstype"},
		{name: "an unknown image file", edit: func(im *criutest.Images) { im.Raw["apparmor.img"] = []byte{1, 2, 3} }, field: "apparmor.img"},
		{name: "descriptors.json reaching CRIU's socket", edit: func(im *criutest.Images) {
			im.Raw["descriptors.json"] = []byte(`["/dev/null","pipe:[1]","pipe:[2]","pipe:[3]"]`)
		}, field: "descriptors.json"},
		{name: "descriptors.json of a container", edit: func(im *criutest.Images) {
			im.Raw["descriptors.json"] = []byte(`["/dev/null","pipe:[1]","pipe:[2]"]`)
		}},
		{name: "a real-time scheduling policy", edit: func(im *criutest.Images) { im.Cores[1].ThreadCore.SchedPolicy = proto.Uint32(1) }, field: "sched_policy"},
		{name: "a lower OOM score", spec: func(s *specs.Spec) { adj := 500; s.Process.OOMScoreAdj = &adj },
			edit: func(im *criutest.Images) { im.Cores[1].Tc.OomScoreAdj = proto.Int32(-1000) }, field: "oom_score_adj"},
		{name: "org.criu.config annotation", spec: func(s *specs.Spec) { s.Annotations = map[string]string{"org.criu.config": "/tmp/x"} }, field: "org.criu.config"},
	}
	cases = append(cases, pathCases...)
	cases = append(cases, taskFileCases...)
	cases = append(cases, namespaceCases...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkEdit(t, tc.spec, tc.edit, tc.field) })
	}
}

// checkEdit checks the images of criutest.DefaultSpec edited by spec,
// made by ForSpec and edited by edit: accepted when field is "", else
// refused naming field.
func checkEdit(t *testing.T, spec func(*specs.Spec), edit func(*criutest.Images), field string) {
	t.Helper()
	s := criutest.DefaultSpec()
	if spec != nil {
		spec(s)
	}
	err := checkImagesOf(t, s, edit)
	if field == "" {
		if err != nil {
			t.Fatalf("refused a checkpoint the spec allows: %v", err)
		}
		return
	}
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("want a refusal naming %q, got %v", field, err)
	}
	if !strings.Contains(r.Error(), field) {
		t.Fatalf("refusal %q does not name %q", r.Error(), field)
	}
}

// checkCase is a case of TestCheck: the default spec edited by spec, its
// own checkpoint edited by edit, refused naming field ("" for accepted).
type checkCase struct {
	name  string
	spec  func(*specs.Spec)
	edit  func(*criutest.Images)
	field string
}

// setMmapMinAddr makes the node's mmap_min_addr v until the returned
// function restores it.
func setMmapMinAddr(v uint64) func() {
	old := mmapMinAddr
	mmapMinAddr = func() uint64 { return v }
	return func() { mmapMinAddr = old }
}

// withAppArmor confines the process with containerd's default profile.
func withAppArmor(s *specs.Spec) { s.Process.ApparmorProfile = "cri-containerd.apparmor.d" }

// withSeccomp gives the spec a profile that denies ptrace (and allows
// everything else); criutest's filter allows everything.
func withSeccomp(s *specs.Spec) {
	s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls:      []specs.LinuxSyscall{{Names: []string{"ptrace"}, Action: specs.ActErrno}}}
}

// denyPtrace is a filter that returns EPERM for every number named ptrace
// on x86_64, x32 and i386, and allows the rest.
func denyPtrace() []byte {
	const ld, jeq, ret = 0x20, 0x15, 0x06
	numbers := func(info *arch.Info, mask uint32) []uint32 {
		var out []uint32
		for nr, name := range info.SyscallNumbers {
			if name == "ptrace" {
				out = append(out, uint32(nr)|mask)
			}
		}
		return out
	}
	const allow, deny = 0x7fff0000, 0x00050000 | 1
	// One block per architecture: if arch matches, load nr, compare with
	// each number (deny on a match), else allow; a block that does not
	// match jumps over itself.
	var prog [][4]uint32
	block := func(auditArch uint32, nrs []uint32) {
		n := uint32(len(nrs))
		prog = append(prog, [4]uint32{ld, 0, 0, 4}, [4]uint32{jeq, 0, uint32(n*2 + 2), auditArch}, [4]uint32{ld, 0, 0, 0})
		for _, nr := range nrs {
			prog = append(prog, [4]uint32{jeq, 0, 1, nr}, [4]uint32{ret, 0, 0, deny})
		}
		prog = append(prog, [4]uint32{ret, 0, 0, allow})
	}
	block(0xc000003e, append(numbers(arch.X86_64, 0), numbers(arch.X32, 0x40000000)...))
	block(0x40000003, numbers(arch.I386, 0))
	prog = append(prog, [4]uint32{ret, 0, 0, deny})
	return criutest.Program(prog...)
}

// addChildIn adds process 2, a child of 1 in 1's namespaces edited by edit.
func addChildIn(edit func(*criucore.TaskKobjIdsEntry)) func(*criutest.Images) {
	return func(im *criutest.Images) {
		c := proto.Clone(im.Cores[1]).(*criucore.CoreEntry)
		edit(c.Ids)
		im.Cores[2] = c
		im.FS[2] = im.FS[1]
		im.Pstree = append(im.Pstree, &pstree.PstreeEntry{Pid: proto.Uint32(2), Ppid: proto.Uint32(1), Pgid: proto.Uint32(1), Sid: proto.Uint32(1), Threads: []uint32{2}})
	}
}

// zombieCore is core-17.img of that dump, byte for byte: the magics, then
// one entry: mtype x86_64 and a task core with task_state 2 (dead), exit
// code 0 and comm "sleep".
var zombieCore = []byte{0x19, 0x43, 0x56, 0x54, 0x47, 0x38, 0x05, 0x55, 0x15, 0x00, 0x00, 0x00,
	0x08, 0x01, 0x1a, 0x11, 0x08, 0x02, 0x10, 0x00, 0x18, 0x00, 0x20, 0x00, 0x28, 0x00, 0x32, 0x05, 's', 'l', 'e', 'e', 'p'}

// addZombie adds process 17, a child of 1 that had exited, as CRIU's
// dump_one_zombie writes it: a core of its name and exit code only, and a
// thread list holding tid, the uninitialized memory CRIU leaves there.
func addZombie(tid uint32) func(*criutest.Images) {
	return func(im *criutest.Images) {
		im.Cores[17] = &criucore.CoreEntry{Mtype: criucore.CoreEntry_X86_64.Enum(),
			Tc: &criucore.TaskCoreEntry{TaskState: proto.Uint32(2), ExitCode: proto.Uint32(0), Personality: proto.Uint32(0),
				Flags: proto.Uint32(0), BlkSigset: proto.Uint64(0), Comm: proto.String("sleep")}}
		im.Pstree = append(im.Pstree, &pstree.PstreeEntry{Pid: proto.Uint32(17), Ppid: proto.Uint32(1), Pgid: proto.Uint32(1), Sid: proto.Uint32(1), Threads: []uint32{tid}})
	}
}

// An entry claiming 2 GiB is refused before anything is allocated.
func TestHugeEntryRefused(t *testing.T) {
	spec := criutest.DefaultSpec()
	dir := t.TempDir()
	if err := criutest.ForSpec(spec).Write(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pstree.img"))
	if err != nil {
		t.Fatal(err)
	}
	b = append(b[:8], 0, 0, 0, 0x80) // the first entry's length: 2 GiB
	if err := os.WriteFile(filepath.Join(dir, "pstree.img"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	err = Check(dir, spec, Options{})
	if err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("want the entry refused by its size, got %v", err)
	}
}

// A symlink in place of an image is refused, not followed.
func TestSymlinkImageRefused(t *testing.T) {
	spec := criutest.DefaultSpec()
	dir := t.TempDir()
	if err := criutest.ForSpec(spec).Write(dir); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "core-1.img")
	elsewhere := filepath.Join(t.TempDir(), "core-1.img")
	if err := os.Rename(p, elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, p); err != nil {
		t.Fatal(err)
	}
	err := Check(dir, spec, Options{})
	if err == nil || !strings.Contains(err.Error(), "core-1.img") {
		t.Fatalf("want the symlinked core image refused, got %v", err)
	}
}
