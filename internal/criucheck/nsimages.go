package criucheck

import (
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	ipcvar "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-var"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timens"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/utsns"
)

// Indexes of nsIDs.
const (
	nsPid  = 0
	nsIpc  = 2
	nsUts  = 3
	nsTime = 7
)

// checkNSImages checks the images of the UTS, IPC and time namespaces the
// restore writes into.
//
// runc gives CRIU the pod's UTS and IPC namespaces, which the spec names by
// path, as namespaces to join (libcontainer/criu_linux.go,
// handleRestoringNamespaces: JoinNs). CRIU still forks the root task with
// CLONE_NEWUTS and CLONE_NEWIPC (the images' namespace IDs differ from its
// own: criu/pstree.c, get_clone_mask), then joins the pod's namespaces
// (criu/cr-restore.c, restore_task_with_children: join_namespaces) and only
// then restores the namespaces' contents into the one it is in
// (criu/namespaces.c, prepare_namespace: prepare_utsns, prepare_ipc_ns): the
// image's host and domain name (criu/uts_ns.c) and IPC limits, semaphores,
// message queues and shared memory (criu/ipc_ns.c) land in the pod's
// namespaces, shared with the pod's other containers, as root.
func (c *checker) checkNSImages() error {
	if err := c.checkNSPerID(); err != nil {
		return err
	}
	if err := c.checkUTS(); err != nil {
		return err
	}
	if err := c.checkIPC(); err != nil {
		return err
	}
	return c.checkTimens()
}

// nsImageOK reports whether image name of a namespace kind is the one CRIU
// reads for the root task: named by the namespace's ID (criu/namespaces.c,
// prepare_namespace, with the inventory's ns_per_id, which checkNSPerID
// requires), and only where the container has a namespace of its own of
// that type (CRIU reads none otherwise).
func (c *checker) nsImageOK(name, prefix string, idx int) bool {
	if c.root[idx] == c.criuIDs[idx] {
		return false
	}
	id, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".img"), 10, 32)
	return err == nil && uint32(id) == c.root[idx]
}

// checkNSPerID refuses images that would have CRIU name the UTS and IPC
// images by the root task's PID rather than by namespace ID: every CRIU
// since 2.x writes ns_per_id (criu/image.c, prepare_inventory).
func (c *checker) checkNSPerID() error {
	if len(c.files["uts"])+len(c.files["ipcvar"])+len(c.files["ipcobj"]) == 0 {
		return nil
	}
	const name = "inventory.img"
	var inv inventory.InventoryEntry
	if err := oneEntry(c.dir, name, "INVENTORY", &inv); err != nil {
		return asRefusal(name, err)
	}
	if !inv.GetNsPerId() {
		return refuse(name, "ns_per_id", "unset: CRIU would read the namespace images by PID")
	}
	return nil
}

// maxUTSName is the kernel's bound on a host or domain name
// (include/uapi/linux/utsname.h, __NEW_UTS_LEN).
const maxUTSName = 64

// checkUTS reads utsns-*.img. The restore writes its names into the pod's
// UTS namespace (kernel/hostname, kernel/domainname). The container's spec
// does not carry the pod's host name (containerd's CRI puts it on the
// sandbox's spec, internal/cri/server/podsandbox/sandbox_run_linux.go,
// WithHostname, and gives a container only the HOSTNAME variable,
// internal/cri/server/container_create.go), and the image holds the
// checkpointed pod's name, which a restore into a pod of another name
// legitimately differs from. So the rule is a bound: the spec's own host
// and domain names where it sets them; otherwise a name of the characters a
// host name has (letters, digits, '-', '.', '_'), at most 64 bytes, and for
// the domain name also "(none)", the kernel's default. A tenant chooses its
// pod's host name anyway (pod.spec.hostname); what is kept out is anything
// else a process of the pod reading its host name might trip on.
func (c *checker) checkUTS() error {
	for _, name := range c.files["uts"] {
		if !c.nsImageOK(name, "utsns-", nsUts) {
			return refuse(name, "", "not the image of the container's own UTS namespace")
		}
		var e utsns.UtsnsEntry
		if err := oneEntry(c.dir, name, "UTSNS", &e); err != nil {
			return asRefusal(name, err)
		}
		if why := utsNameWhy(e.GetNodename(), c.p.spec.Hostname, ""); why != "" {
			return refuse(name, "nodename", "%q %s", e.GetNodename(), why)
		}
		if why := utsNameWhy(e.GetDomainname(), c.p.spec.Domainname, "(none)"); why != "" {
			return refuse(name, "domainname", "%q %s", e.GetDomainname(), why)
		}
	}
	return nil
}

func utsNameWhy(v, spec, dflt string) string {
	switch {
	case spec != "":
		if v != spec {
			return "is not the spec's " + quote(spec)
		}
		return ""
	case v == dflt && dflt != "":
		return ""
	case v == "" || len(v) > maxUTSName:
		return "is empty or longer than 64 bytes"
	}
	for i := 0; i < len(v); i++ {
		b := v[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '.' || b == '_') {
			return "has a character no host name has"
		}
	}
	return ""
}

// The IPC limits of a new IPC namespace: what the pod's namespace holds
// unless the pod sets them (kernel: include/uapi/linux/shm.h SHMMAX, SHMALL,
// SHMMNI; include/uapi/linux/msg.h MSGMAX, MSGMNB, MSGMNI;
// include/uapi/linux/sem.h SEMMSL, SEMMNS, SEMOPM, SEMMNI;
// include/linux/ipc_namespace.h DFLT_QUEUESMAX, DFLT_MSGMAX,
// DFLT_MSGSIZEMAX, DFLT_MSG, DFLT_MSGSIZE, set by ipc/shm.c shm_init_ns,
// ipc/msg.c msg_init_ns, ipc/sem.c sem_init_ns, ipc/mqueue.c mq_init_ns).
var ipcDefaults = []struct {
	key string // the spec's sysctl name
	max uint64
	get func(*ipcvar.IpcVarEntry) (uint64, bool)
}{
	{"kernel.msgmax", 8192, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetMsgCtlmax()), true }},
	{"kernel.msgmnb", 16384, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetMsgCtlmnb()), true }},
	{"kernel.msgmni", 32000, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetMsgCtlmni()), true }},
	{"kernel.auto_msgmni", 1, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetAutoMsgmni()), true }},
	{"kernel.shmmax", ^uint64(0) - 1<<24, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return e.GetShmCtlmax(), true }},
	{"kernel.shmall", ^uint64(0) - 1<<24, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return e.GetShmCtlall(), true }},
	{"kernel.shmmni", 4096, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetShmCtlmni()), true }},
	{"kernel.shm_rmid_forced", 1, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetShmRmidForced()), true }},
	{"fs.mqueue.queues_max", 256, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetMqQueuesMax()), true }},
	{"fs.mqueue.msg_max", 10, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetMqMsgMax()), true }},
	{"fs.mqueue.msgsize_max", 8192, func(e *ipcvar.IpcVarEntry) (uint64, bool) { return uint64(e.GetMqMsgsizeMax()), true }},
	{"fs.mqueue.msg_default", 10, func(e *ipcvar.IpcVarEntry) (uint64, bool) {
		return uint64(e.GetMqMsgDefault()), e.MqMsgDefault != nil
	}},
	{"fs.mqueue.msgsize_default", 8192, func(e *ipcvar.IpcVarEntry) (uint64, bool) {
		return uint64(e.GetMqMsgsizeDefault()), e.MqMsgsizeDefault != nil
	}},
}

// semDefaults are kernel.sem's four values in a new namespace (SEMMSL,
// SEMMNS, SEMOPM, SEMMNI), the four CRIU dumps (criu/ipc_ns.c, dump_ipc_var).
var semDefaults = [4]uint64{32000, 1024000000, 500, 32000}

// checkIPC reads ipcns-var-*.img, the IPC limits the restore writes into
// the pod's IPC namespace (criu/ipc_ns.c, prepare_ipc_var, ipc_sysctl_req).
// The limits bound the memory and objects of System V and POSIX IPC for
// every container of the pod, which is why the kubelet admits raising them
// only as unsafe sysctls. Each value must be at most a new namespace's
// (a lower limit restricts the pod alone), or the spec's own sysctl for it.
// The next-ID values (msg_next_id...) only number the namespace's next
// objects and are not bounded. The namespace's objects (ipcns-shm, -msg,
// -sem) must be of the container's IPC namespace; their contents are not
// checked here.
func (c *checker) checkIPC() error {
	var sysctl map[string]string
	if c.p.spec.Linux != nil {
		sysctl = c.p.spec.Linux.Sysctl
	}
	for _, kind := range []struct{ kind, prefix string }{{"ipcvar", "ipcns-var-"}, {"ipcobj", ""}} {
		for _, name := range c.files[kind.kind] {
			prefix := kind.prefix
			if prefix == "" {
				prefix = name[:strings.LastIndexByte(name, '-')+1]
			}
			if !c.nsImageOK(name, prefix, nsIpc) {
				return refuse(name, "", "not an image of the container's own IPC namespace")
			}
		}
	}
	for _, name := range c.files["ipcvar"] {
		var e ipcvar.IpcVarEntry
		if err := oneEntry(c.dir, name, "IPC_VAR", &e); err != nil {
			return asRefusal(name, err)
		}
		for _, d := range ipcDefaults {
			v, ok := d.get(&e)
			if !ok || v <= d.max {
				continue
			}
			if s, set := sysctl[d.key]; set && strings.TrimSpace(s) == strconv.FormatUint(v, 10) {
				continue
			}
			return refuse(name, ipcField(d.key), "%d is above a new IPC namespace's %d, and the spec does not set %s to it", v, d.max, d.key)
		}
		sem := e.GetSemCtls()
		if len(sem) != len(semDefaults) {
			return refuse(name, "sem_ctls", "%d values; kernel.sem has 4", len(sem))
		}
		var above bool
		for i, v := range sem {
			above = above || uint64(v) > semDefaults[i]
		}
		if above && !sysctlIs(sysctl["kernel.sem"], sem) {
			return refuse(name, "sem_ctls", "%v is above a new IPC namespace's %v, and the spec does not set kernel.sem to it", sem, semDefaults)
		}
	}
	return nil
}

func ipcField(key string) string {
	switch key {
	case "kernel.msgmax":
		return "msg_ctlmax"
	case "kernel.msgmnb":
		return "msg_ctlmnb"
	case "kernel.msgmni":
		return "msg_ctlmni"
	case "kernel.auto_msgmni":
		return "auto_msgmni"
	case "kernel.shmmax":
		return "shm_ctlmax"
	case "kernel.shmall":
		return "shm_ctlall"
	case "kernel.shmmni":
		return "shm_ctlmni"
	case "kernel.shm_rmid_forced":
		return "shm_rmid_forced"
	}
	return "mq_" + strings.TrimPrefix(key, "fs.mqueue.")
}

// sysctlIs reports whether the spec's value s (kernel.sem: four numbers
// separated by blanks) is vs.
func sysctlIs(s string, vs []uint32) bool {
	f := strings.Fields(s)
	if len(f) != len(vs) {
		return false
	}
	for i, v := range vs {
		if f[i] != strconv.FormatUint(uint64(v), 10) {
			return false
		}
	}
	return true
}

// maxClockSeconds bounds a clock of timens-*.img: a century, far above
// the uptime of any node a checkpoint was taken on.
const maxClockSeconds = 100 * 36525 * 86400 / 100

// checkTimens reads timens-*.img. On a kernel with time namespaces CRIU
// restores every tree in a new one whose offsets make CLOCK_MONOTONIC and
// CLOCK_BOOTTIME read the image's values (criu/cr-restore.c,
// restore_task_with_children: prepare_timens; criu/timens.c): timens-0.img,
// the dumping CRIU's own clocks (criu/cr-dump.c, dump_time_ns(0)), where the
// container has no time namespace of its own, else the namespace's image.
// The namespace is the container's alone and the kernel bounds the
// resulting clocks (kernel/time/namespace.c, proc_timens_set_offset), so
// the rule is a bound: whole nanoseconds below a second, seconds below a
// century, boottime not below monotonic (boottime is monotonic plus the
// time suspended, and dump_time_ns reads it second).
func (c *checker) checkTimens() error {
	want := "timens-0.img"
	if c.root[nsTime] != c.criuIDs[nsTime] {
		want = "timens-" + strconv.FormatUint(uint64(c.root[nsTime]), 10) + ".img"
	}
	for _, name := range c.files["timens"] {
		if name != want {
			return refuse(name, "", "not the time namespace image the restore reads (%s)", want)
		}
		var e timens.TimensEntry
		if err := oneEntry(c.dir, name, "TIMENS", &e); err != nil {
			return asRefusal(name, err)
		}
		for _, cl := range []struct {
			field string
			ts    *timens.Timespec
		}{{"monotonic", e.GetMonotonic()}, {"boottime", e.GetBoottime()}} {
			if cl.ts.GetTvNsec() >= 1e9 || cl.ts.GetTvSec() > maxClockSeconds {
				return refuse(name, cl.field, "%d.%09d s is not a clock of a node (seconds below %d, nanoseconds below a second)", cl.ts.GetTvSec(), cl.ts.GetTvNsec(), uint64(maxClockSeconds))
			}
		}
		m, b := e.GetMonotonic(), e.GetBoottime()
		if b.GetTvSec() < m.GetTvSec() || b.GetTvSec() == m.GetTvSec() && b.GetTvNsec() < m.GetTvNsec() {
			return refuse(name, "boottime", "below monotonic: CLOCK_BOOTTIME never reads less than CLOCK_MONOTONIC")
		}
	}
	return nil
}
